package bucket_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
)

// TestSweepKeepsProviderDebt: TestExpiredProviderBucketKeepsItsDebt
// with a sweep between the report's end and the next call. Local's sweep
// reads a key's own tokens as they were last advanced, before the fold of
// the provider's bucket that has run its time: the key, in debt once
// folded, looks full and is forgotten, and the next call finds it full
// and goes at once. The scripts keep the hash (its expiry is past the
// provider's bucket's refill) and the call waits 2.1 s.
func TestSweepKeepsProviderDebt(t *testing.T) {
	clk := &fakeClock{t: epoch}
	b := bucket.NewLocal(bucket.PerSecond(10), bucket.WithClock(clk))
	ctx := t.Context()
	require.NoError(t, b.Observe(ctx, "expired", adaptive.Feedback{Quotas: map[string]adaptive.Quota{
		bucket.Requests: {Limit: 60, Remaining: 10, Window: time.Minute}}}))
	for range 100 {
		_, err := b.Reserve(ctx, "expired", bucket.N(1), bucket.Unlimited)
		require.NoError(t, err)
	}
	for i := range 1023 { // other keys, enough for a sweep
		_, err := b.Reserve(ctx, fmt.Sprintf("other-%d", i), bucket.N(1), 0)
		require.NoError(t, err)
	}
	clk.Advance(61 * time.Second)
	_, err := b.Reserve(ctx, "one-more", bucket.N(1), 0) // a new key: it sweeps
	require.NoError(t, err)
	r, err := b.Reserve(ctx, "expired", bucket.N(1), bucket.Unlimited)
	require.NoError(t, err)
	assert.InDelta(t, 2*time.Second+100*time.Millisecond, r.Delay, float64(time.Millisecond),
		"the provider's debt folded into ours must survive a sweep")
}

// TestPausedCountOutlivesItsHash: the count of refusals starts
// at the first 429 and is moved on by the pause it sets (1.5 s), so it
// holds until 3.5 s after it (ThresholdWindows: 2 windows of 1 s); a
// second 429 at 3.2 s is the second refusal of the count, and decreases
// the rate (Threshold 2). Local does; on Redis the hash of the count (c,
// cs) was set to expire at 3 s, one window plus a second from the first
// 429, not moved on by the pause: the count is gone and the rate stays.
func TestPausedCountOutlivesItsHash(t *testing.T) {
	got := map[string]uint64{}
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			b := be.new(t, bucket.PerSecond(10), bucket.WithPolicy(adaptive.Policy{Threshold: 2}))
			require.NoError(t, b.Observe(ctx, "k", adaptive.Feedback{Class: adaptive.RateLimited,
				HasRetryAfter: true, RetryAfter: 1500 * time.Millisecond}))
			be.advance(3200 * time.Millisecond)
			require.NoError(t, b.Observe(ctx, "k", rateLimited(0)))
			r, err := b.Reserve(ctx, "k", bucket.N(1), 0)
			require.NoError(t, err)
			got[be.name] = r.Epoch
		})
	}
	assert.Equal(t, got["local"], got["redis"], "the decreases after the same 429s (epochs)")
}
