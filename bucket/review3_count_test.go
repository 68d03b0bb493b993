package bucket_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
)

// TestRatedReportResetsCountAlike: a report that gives a rate
// forgets the refusals counted (Local: refused = 0; Lua: HDEL c cs), but
// Local keeps the count's start, moved on by the pause of the 429 before
// it, and the next 429s are counted against it: three plain 429s (each
// pausing the key a window now) decrease the rate on Redis and not on
// Local.
func TestRatedReportResetsCountAlike(t *testing.T) {
	got := map[string]time.Duration{}
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			b := be.new(t, bucket.PerSecond(10))
			no := adaptive.Feedback{Class: adaptive.RateLimited} // asks no wait, reports no quota
			require.NoError(t, b.Observe(ctx, "k", no))
			require.NoError(t, b.Observe(ctx, "k", adaptive.Feedback{Quotas: map[string]adaptive.Quota{
				bucket.Requests: {Limit: 10, Remaining: 5, Reset: time.Second}}})) // a rate: the count is forgotten
			be.advance(2500 * time.Millisecond)
			require.NoError(t, b.Observe(ctx, "k", no))
			be.advance(1600 * time.Millisecond)
			require.NoError(t, b.Observe(ctx, "k", no))
			require.NoError(t, b.Observe(ctx, "k", no))
			be.advance(10 * time.Second)
			g, _ := gap(t, b, "k")
			got[be.name] = g
		})
	}
	t.Log(got)
	assert.InDelta(t, got["local"], got["redis"], float64(time.Microsecond), "Local and the scripts agree on the decrease (to the scripts' microsecond)")
}

// TestCountAfterDecreaseAlike: after a decrease the next refusal
// starts a new count on Redis (cs = 0), but Local keeps the old count's
// start (k.counting), so the refusals after it are counted over a
// different window: three 429s that decrease the rate on Redis do not on
// Local. No pause is involved (Retry-After: 0).
func TestCountAfterDecreaseAlike(t *testing.T) {
	got := map[string]time.Duration{}
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			b := be.new(t, bucket.PerSecond(10))
			for range 3 {
				require.NoError(t, b.Observe(ctx, "k", rateLimited(0)))
			}
			be.advance(1500 * time.Millisecond)
			require.NoError(t, b.Observe(ctx, "k", rateLimited(1)))
			be.advance(time.Second)
			require.NoError(t, b.Observe(ctx, "k", rateLimited(1)))
			be.advance(100 * time.Millisecond)
			require.NoError(t, b.Observe(ctx, "k", rateLimited(1)))
			r, err := b.Reserve(ctx, "k", bucket.N(1), 0)
			require.NoError(t, err)
			got[be.name] = time.Duration(r.Epoch)
		})
	}
	assert.Equal(t, got["local"], got["redis"], "the epochs (decreases) after the same 429s")
}
