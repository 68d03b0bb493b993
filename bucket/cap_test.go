package bucket_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
)

// A report that caps a key's own rate (a limit with no remaining), the
// reads of a key, and a zero Adjust, each under Local and the scripts
// alike: the faults left open in December 2026 (docs/reference.md).

// capQueue observes a cap of 5/s (50 per 10 s, no remaining: burst 10,
// the configured one) for 10 s on key, under 10/s, and reserves 100 calls
// at once: 10 go at once and 90 are paced at 5/s, the last at 18 s.
func capQueue(t *testing.T, b bucket.Bucket, key string) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
		bucket.Requests: {Limit: 50, Remaining: -1, Window: 10 * time.Second}}}))
	var last time.Duration
	for range 100 {
		r, err := b.Reserve(ctx, key, bucket.N(1), bucket.Unlimited)
		require.NoError(t, err)
		require.True(t, r.OK)
		last = r.Delay
	}
	require.InDelta(t, 18*time.Second, last, float64(time.Millisecond), "the cap paces the queue")
}

// TestExpiredCapRefillsAtCapUntilItsEnd: capQueue's key, 12 s in. Until
// the cap's end (10 s) the key refilled at 5/s, 50 of its debt of 90; the
// 40 still owed were paced at the cap, so the cap counts on until they
// are repaid, at 18 s: 30 owed at 12 s, and a call waits 6.2 s, after the
// last paced slot. The key refilled the whole 12 s at 10/s and read full,
// with 30 paced slots still to come; folded at the cap's end and refilled
// at 10/s from then, it owed 20 and a call went at 14.1 s, before the
// last 20 of them (TestCapEndBoundsTheFleet).
func TestExpiredCapRefillsAtCapUntilItsEnd(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			key := "cap-end-" + be.name
			b := be.new(t, bucket.PerSecond(10))
			capQueue(t, b, key)
			be.advance(12 * time.Second)
			assert.InDelta(t, -30, be.tokens(t, key)[bucket.Requests], 1e-3)
			r, err := b.Reserve(t.Context(), key, bucket.N(1), bucket.Unlimited)
			require.NoError(t, err)
			assert.InDelta(t, 6200*time.Millisecond, r.Delay, float64(time.Millisecond))
		})
	}
}

// TestExpiredCapOutlivesItsRefill: a cap of 0.5/s and 5 (5 per 10 s)
// under 1/s and 100 counts 100 s (one refill of the configured limit);
// 5 calls empty the key at once. At the cap's end it holds 5 again, and
// it refills to 100 at 1/s from then: 55 at 150 s, full at 195 s. The
// hash was set to expire at 110 s (from the capped limit, full at 10 s,
// after the cap's end plus the capped refill time), and read full
// after it.
func TestExpiredCapOutlivesItsRefill(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			key := "cap-expiry-" + be.name
			b := be.new(t, bucket.Limit{Rate: 1, Burst: 100})
			require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
				bucket.Requests: {Limit: 5, Remaining: -1, Window: 10 * time.Second}}}))
			r, err := b.Reserve(ctx, key, bucket.N(5), 0)
			require.NoError(t, err)
			require.True(t, r.OK)
			for _, at := range []struct {
				after time.Duration
				want  float64
			}{{90 * time.Second, 5}, {60 * time.Second, 55}, {40 * time.Second, 95}, {10 * time.Second, 100}} {
				be.advance(at.after)
				assert.InDelta(t, at.want, be.tokens(t, key)[bucket.Requests], 1e-3)
			}
		})
	}
}

// TestReadsDuringCapChangeNothing: capQueue's key, read at 1 s, 5 s and
// 9.5 s, still under the cap; at 12 s a call waits 6.2 s as it does with
// no read (TestExpiredCapRefillsAtCapUntilItsEnd). A Local read wrote
// the key refilled to then, at the cap, and the end of the cap found
// Local and the scripts apart: Local's key refilled from the read at 10/s
// (a call at 12 s went at once), the scripts' key from its last write.
func TestReadsDuringCapChangeNothing(t *testing.T) {
	got := map[string]time.Duration{}
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			key := "cap-reads-" + be.name
			b := be.new(t, bucket.PerSecond(10))
			capQueue(t, b, key)
			var moved time.Duration
			for _, at := range []time.Duration{time.Second, 5 * time.Second, 9500 * time.Millisecond} {
				be.advance(at - moved)
				moved = at
				assert.InDelta(t, -90+5*at.Seconds(), be.tokens(t, key)[bucket.Requests], 1e-3)
				if l, ok := b.(*bucket.Local); ok {
					assert.Equal(t, 5.0, l.Rate(key)[bucket.Requests])
				}
			}
			be.advance(12*time.Second - moved)
			r, err := b.Reserve(t.Context(), key, bucket.N(1), bucket.Unlimited)
			require.NoError(t, err)
			got[be.name] = r.Delay
			assert.InDelta(t, 6200*time.Millisecond, r.Delay, float64(time.Millisecond))
		})
	}
	assert.InDelta(t, got["local"], got["redis"], float64(time.Millisecond))
}

// TestColdReadMakesNoKey: on a cold start a key that no call has charged
// is empty; a read of it (Tokens) makes none on Redis, and a call of 10
// half a second later makes it with the 10 it takes (adaptive.Policy's
// ColdStart) and goes at once. A Local read made the key, empty from
// then: the call found 5 and was refused.
func TestColdReadMakesNoKey(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			key := "cold-read-" + be.name
			b := be.new(t, bucket.PerSecond(10), bucket.WithPolicy(adaptive.Policy{ColdStart: true}))
			assert.Equal(t, 0.0, be.tokens(t, key)[bucket.Requests])
			if l, ok := b.(*bucket.Local); ok {
				assert.Equal(t, 10.0, l.Rate(key)[bucket.Requests])
				assert.Zero(t, l.Len(), "a read makes no key")
			}
			be.advance(500 * time.Millisecond)
			r, err := b.Reserve(t.Context(), key, bucket.N(10), 0)
			require.NoError(t, err)
			assert.True(t, r.OK, "refused: retry after %v", r.RetryAfter)
		})
	}
}

// TestColdZeroAdjustMakesNoKey: on a cold start a zero Adjust (or
// Settle) of a key no call has charged makes none (the scripts run
// nothing for it), and a call of 10 half a second later goes at once.
// Local made the key, empty from then: the call found 5 and was refused.
func TestColdZeroAdjustMakesNoKey(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			b := be.new(t, bucket.PerSecond(10), bucket.WithPolicy(adaptive.Policy{ColdStart: true}),
				bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 100, Burst: 1000}))
			for i, adjust := range []func(key string, c bucket.Cost) error{
				func(key string, c bucket.Cost) error { return b.Adjust(ctx, key, c) },
				func(key string, c bucket.Cost) error { return b.(bucket.Settler).Settle(ctx, key, c) },
			} {
				key := []string{"cold-adjust-", "cold-settle-"}[i] + be.name
				l, local := b.(*bucket.Local)
				var n int
				if local {
					n = l.Len()
				}
				require.NoError(t, adjust(key, bucket.Cost{bucket.Requests: 0, bucket.Tokens: 0}))
				if local {
					assert.Equal(t, n, l.Len(), "a zero delta makes no key")
				}
				be.advance(500 * time.Millisecond)
				r, err := b.Reserve(ctx, key, bucket.Cost{bucket.Requests: 10, bucket.Tokens: 1000}, 0)
				require.NoError(t, err)
				assert.True(t, r.OK, "refused: retry after %v", r.RetryAfter)
			}
		})
	}
}

// TestExpiredProviderBucketCapsUntilItsEnd: a provider's bucket no larger
// than ours (60 a minute, all left, under 10/s and 100) caps our rate at
// its 1/s too. 60 calls empty both at once; a 429 pauses the key 10 s,
// which leaves ours empty at its end while the provider's refills to 10.
// At the report's end (60 s) ours has refilled at 1/s to 50, and from
// then at 10/s: 60 at 61 s. Ours refilled at 10/s from the pause's end
// (to the provider's 60 at 60 s) and held 70.
func TestExpiredProviderBucketCapsUntilItsEnd(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			key := "provider-cap-" + be.name
			b := be.new(t, bucket.Limit{Rate: 10, Burst: 100})
			require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
				bucket.Requests: {Limit: 60, Remaining: 60, Window: time.Minute}}}))
			r, err := b.Reserve(ctx, key, bucket.N(60), 0)
			require.NoError(t, err)
			require.True(t, r.OK)
			require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.RateLimited,
				HasRetryAfter: true, RetryAfter: 10 * time.Second}))
			be.advance(61 * time.Second)
			assert.InDelta(t, 60, be.tokens(t, key)[bucket.Requests], 1e-3)
		})
	}
}
