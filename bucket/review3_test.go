package bucket_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
)

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
// when its report has run its time, what it was owed then stays owed, in
// the key's own bucket, repaid from then at the configured 10/s: 30 calls'
// worth at 60 s, so a call at 61 s waits 2.1 s, not nothing.
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
			assert.InDelta(t, 2*time.Second+100*time.Millisecond, r.Delay, float64(time.Millisecond))
		})
	}
}
