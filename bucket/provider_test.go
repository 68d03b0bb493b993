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

// The provider's bucket learnt from reports, the pause of a 429 that asks
// for no wait, and the count of refusals, each under Local and the scripts
// alike: the faults two reviews found in them, December 2026.

// TestLimitOnlyReportKeepsProviderDebt: the provider's bucket
// (60 a minute, 10 left) paces a queue 90 s deep; a later report that
// restates the limit without a remaining drops the provider's bucket, and
// with it the whole debt: the key's own bucket, which no longer carried it,
// lets the next calls go at once while 80 queued slots are still to come.
// Before 08441cd the key's own bucket refilled at the reported rate and
// carried the debt (the next call waited 81 s).
func TestLimitOnlyReportKeepsProviderDebt(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			key := "limit-only-" + be.name
			b := be.new(t, bucket.PerSecond(10))
			require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
				bucket.Requests: {Limit: 60, Remaining: 10, Window: time.Minute}}}))
			var last time.Duration
			for k := 0; k < 100; k++ {
				r, err := b.Reserve(ctx, key, bucket.N(1), bucket.Unlimited)
				require.NoError(t, err)
				require.True(t, r.OK)
				last = time.Duration(k)*100*time.Millisecond + r.Delay
				be.advance(100 * time.Millisecond)
			}
			require.InDelta(t, 90*time.Second, last, float64(time.Millisecond), "the provider's 1/s paces the queue")
			// 10 s in: the same limit, no remaining.
			require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
				bucket.Requests: {Limit: 60, Remaining: -1, Window: time.Minute}}}))
			r, err := b.Reserve(ctx, key, bucket.N(1), bucket.Unlimited)
			require.NoError(t, err)
			assert.GreaterOrEqual(t, r.Delay, 80*time.Second,
				"a report that says nothing of what remains must not forgive the 80 s of queue still to come")
		})
	}
}

// TestRateUnderProviderBucket: Rate's doc (and the rate gauge's,
// docs/observability.md) says the rate is the provider's where it
// reported a lower one; with the provider's bucket it stays the configured.
func TestRateUnderProviderBucket(t *testing.T) {
	clk := &fakeClock{t: epoch}
	b := bucket.NewLocal(bucket.PerSecond(10), bucket.WithClock(clk))
	require.NoError(t, b.Observe(t.Context(), "k", adaptive.Feedback{Quotas: map[string]adaptive.Quota{
		bucket.Requests: {Limit: 60, Remaining: 10, Window: time.Minute}}}))
	assert.Equal(t, 1.0, b.Rate("k")[bucket.Requests], "the provider reported 1/s, lower than 10/s")
}

// TestUnbelievedQuotaPausesAsNone: a 429 that asks for no wait and whose
// only quota the bucket does not believe (a reset 100 years out, "a lie,
// remaining and all") or does not limit (a dimension it has no limit for)
// reports no quota the bucket can use: it pauses the key as a 429 that
// reports none. It paused nothing when the pause looked at fb.Quotas
// rather than at what the bucket kept.
func TestUnbelievedQuotaPausesAsNone(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			b := be.new(t, bucket.PerSecond(10))
			for name, q := range map[string]map[string]adaptive.Quota{
				"lie":   {bucket.Requests: {Limit: 10, Remaining: 0, Reset: 100 * 365 * 24 * time.Hour}},
				"other": {bucket.Tokens: {Limit: 1000, Remaining: 0, Reset: time.Second}},
			} {
				key := "unbelieved-" + name
				require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.RateLimited, Quotas: q}))
				r, err := b.Reserve(ctx, key, bucket.N(1), bucket.Unlimited)
				require.NoError(t, err)
				assert.Equal(t, 1100*time.Millisecond, r.Delay, "%s: as a 429 that reports no quota", name)
			}
		})
	}
}

// TestExpiredProviderBucketKeepsItsDebt: the provider's bucket (60 a
// minute, 10 left, its report good for a minute) paces a queue 90 s deep;
// when its report has run its time, what it was owed then stays owed, 30
// calls' worth at 60 s, paced at 1/s until 90 s: carried into the key's
// own bucket at what it is worth at the configured 10/s, 300, repaid at
// 90 s too (see TestCapEndBoundsTheFleet), so a call at 61 s waits 29.1
// s, after the last of them, not nothing (and not 2.1 s, as 30 repaid at
// 10/s would have it, ahead of 27 paced slots).
func TestExpiredProviderBucketKeepsItsDebt(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			b := be.new(t, bucket.PerSecond(10))
			require.NoError(t, b.Observe(ctx, "expired", adaptive.Feedback{Quotas: map[string]adaptive.Quota{
				bucket.Requests: {Limit: 60, Remaining: 10, Window: time.Minute}}}))
			for range 100 {
				_, err := b.Reserve(ctx, "expired", bucket.N(1), bucket.Unlimited)
				require.NoError(t, err)
			}
			be.advance(61 * time.Second)
			r, err := b.Reserve(ctx, "expired", bucket.N(1), bucket.Unlimited)
			require.NoError(t, err)
			assert.InDelta(t, 29100*time.Millisecond, r.Delay, float64(time.Millisecond))
		})
	}
}

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

// TestSweepKeepsProviderDebt: TestExpiredProviderBucketKeepsItsDebt
// with a sweep between the report's end and the next call. Local's sweep
// reads a key's own tokens as they were last advanced, before the fold of
// the provider's bucket that has run its time: the key, in debt once
// folded, looks full and is forgotten, and the next call finds it full
// and goes at once. The scripts keep the hash (its expiry is past the
// provider's bucket's refill) and the call waits 29.1 s.
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
	assert.InDelta(t, 29100*time.Millisecond, r.Delay, float64(time.Millisecond),
		"the provider's debt must survive a sweep")
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
