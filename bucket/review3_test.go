package bucket_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
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

// TestFlappingRedisWithProviderBucket: as
// TestFlappingRedisHandsNoTimeOutTwice, with a provider's bucket (60 a
// minute, 10 left) learnt during the first outage: the first share's queue
// is 20 s deep at the provider's 1/s, but the second share starts each key
// at the end of the first's own debt (queueEnd), 2 s at the configured
// 10/s, handing out again the provider's time the first share queued.
func TestFlappingRedisWithProviderBucket(t *testing.T) {
	srv := redistest.Own(t)
	rdb := fastClient(t, srv.Addr)
	b := bucket.NewRedis(rdb, bucket.PerSecond(10), quickBreaker)
	ctx := t.Context()
	_, err := b.Reserve(ctx, "warm", bucket.N(1), 0)
	require.NoError(t, err)
	srv.Stop()
	_, err = b.Reserve(ctx, "k", bucket.N(1), bucket.Unlimited) // the share, empty
	require.NoError(t, err)
	require.NoError(t, b.Observe(ctx, "k", adaptive.Feedback{Quotas: map[string]adaptive.Quota{
		bucket.Requests: {Limit: 60, Remaining: 10, Window: time.Minute}}}))
	var last time.Duration
	for range 30 {
		r, err := b.Reserve(ctx, "k", bucket.N(1), bucket.Unlimited)
		require.NoError(t, err)
		last = r.Delay
	}
	require.Greater(t, last, 15*time.Second, "the provider's 1/s paces the first share")
	start := time.Now()
	redisBack(t, srv, b) // "k" is not called: nothing settles it
	srv.Stop()
	r, err := b.Reserve(ctx, "k", bucket.N(1), bucket.Unlimited)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, r.Delay+time.Since(start), last,
		"the second share starts after the first one's queue")
}

// TestUnbelievedQuotaPausesAsNone: a 429 that asks for no wait
// and whose only quota the bucket does not believe (a reset 100 years out,
// "a lie, remaining and all") or does not limit (a dimension it has no
// limit for) reports no quota the bucket can use, yet it pauses nothing:
// adaptation.pause tests len(fb.Quotas), not what the bucket learnt.
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
