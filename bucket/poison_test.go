package bucket_test

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// poisons are single responses from a lying upstream (or a proxy's bug).
// Before bounds, each stalled its key for the fleet: for years, or until a
// response that could never be sent corrected it.
var poisons = []struct {
	name  string
	apply func(t *testing.T, b bucket.Bucket, key string)
}{
	{"usage 1e15", func(t *testing.T, b bucket.Bucket, key string) {
		require.NoError(t, b.Adjust(t.Context(), key, bucket.N(1e15)))
	}},
	{"usage 1e300", func(t *testing.T, b bucket.Bucket, key string) {
		require.NoError(t, b.Adjust(t.Context(), key, bucket.N(1e300)))
	}},
	{"usage -5", func(t *testing.T, b bucket.Bucket, key string) {
		require.NoError(t, b.Adjust(t.Context(), key, bucket.N(-5)))
	}},
	{"usage NaN", func(t *testing.T, b bucket.Bucket, key string) {
		require.ErrorIs(t, b.Adjust(t.Context(), key, bucket.N(math.NaN())), bucket.ErrInvalidCost)
	}},
	{"reset 100000h", func(t *testing.T, b bucket.Bucket, key string) {
		require.NoError(t, b.Observe(t.Context(), key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
			bucket.Requests: {Limit: 1000, Remaining: 0, Reset: 100000 * time.Hour}}}))
	}},
	{"reset 2000000h", func(t *testing.T, b bucket.Bucket, key string) {
		require.NoError(t, b.Observe(t.Context(), key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
			bucket.Requests: {Limit: 1000, Remaining: 0, Reset: 2000000 * time.Hour}}}))
	}},
	{"limit 1e-6 per second", func(t *testing.T, b bucket.Bucket, key string) {
		require.NoError(t, b.Observe(t.Context(), key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
			bucket.Requests: {Limit: 1e-6, Remaining: 0, Window: time.Second}}}))
	}},
	{"window 1e6 s", func(t *testing.T, b bucket.Bucket, key string) {
		require.NoError(t, b.Observe(t.Context(), key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
			bucket.Requests: {Limit: 1, Remaining: 0, Window: 1e6 * time.Second}}}))
	}},
	{"retry-after 100000h", func(t *testing.T, b bucket.Bucket, key string) {
		require.NoError(t, b.Observe(t.Context(), key, adaptive.Feedback{Class: adaptive.RateLimited,
			RetryAfter: 100000 * time.Hour}))
	}},
	{"retry-after on a success", func(t *testing.T, b bucket.Bucket, key string) {
		require.NoError(t, b.Observe(t.Context(), key, adaptive.Feedback{RetryAfter: time.Hour,
			Quotas: map[string]adaptive.Quota{bucket.Tokens: {Remaining: 5}}}))
	}},
}

// TestPoisonedFeedbackIsBounded: after any one poison, the key admits again
// within two windows of the limit (10/s, burst 10: 2 s), at the configured
// rate, on Local and the Lua scripts alike.
func TestPoisonedFeedbackIsBounded(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			for _, p := range poisons {
				t.Run(p.name, func(t *testing.T) {
					b := be.new(t, bucket.PerSecond(10))
					key := "poison:" + p.name
					_, err := b.Reserve(t.Context(), key, bucket.N(1), 0)
					require.NoError(t, err)
					p.apply(t, b, key)
					r, err := b.Reserve(t.Context(), key, bucket.N(1), bucket.Unlimited)
					require.NoError(t, err)
					require.True(t, r.OK)
					// A debit takes at most a burst: one window to repay;
					// a pause lasts at most the horizon (120 windows).
					wait := 2 * time.Second
					if strings.HasPrefix(p.name, "retry-after 1") {
						wait = 120*time.Second + 100*time.Millisecond // empty at its end
					}
					assert.LessOrEqual(t, r.Delay, wait+time.Millisecond, "the next call's wait")
					be.advance(wait)
					g, _ := gap(t, b, key)
					assert.Equal(t, 100*time.Millisecond, g, "the configured rate")
				})
			}
		})
	}
}

// TestPauseIsBoundedByTheHorizon: a Retry-After is honoured up to the
// horizon (RecoveryWindows windows: 120 s at 10/s), no longer.
func TestPauseIsBoundedByTheHorizon(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			b := be.new(t, bucket.PerSecond(10))
			require.NoError(t, b.Observe(t.Context(), "k", adaptive.Feedback{Class: adaptive.RateLimited,
				RetryAfter: 100000 * time.Hour}))
			r, err := b.Reserve(t.Context(), "k", bucket.N(1), bucket.Unlimited)
			require.NoError(t, err)
			assert.InDelta(t, 120*time.Second, r.Delay, float64(200*time.Millisecond))
		})
	}
}

// TestReportedLimitsHeal: a believable report of a low limit (2 requests a
// day, spent) slows the key to the floor (2% of 10/s), and only until the
// horizon: the key is at the configured rate again after it.
func TestReportedLimitsHeal(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			b := be.new(t, bucket.PerSecond(10))
			require.NoError(t, b.Observe(t.Context(), "k", adaptive.Feedback{Quotas: map[string]adaptive.Quota{
				bucket.Requests: {Limit: 2, Remaining: 0, Reset: 23 * time.Hour}}}))
			g, _ := gap(t, b, "k")
			assert.Equal(t, 5*time.Second, g, "floored at 2% of the configured rate")
			be.advance(121 * time.Second)
			r, err := b.Reserve(t.Context(), "k", bucket.N(1), 0)
			require.NoError(t, err)
			assert.True(t, r.OK, "refilled by the time the report expired")
			g, _ = gap(t, b, "k")
			assert.Equal(t, 100*time.Millisecond, g, "the configured rate again")
		})
	}
}

// TestPoisonedKeyTTL: on a real redis-server, no poison gives a key a TTL
// beyond the horizon (120 s at 10/s) plus a refill and its slack.
func TestPoisonedKeyTTL(t *testing.T) {
	rdb := redistest.Client(t)
	b := bucket.NewRedis(rdb, bucket.PerSecond(10), bucket.WithPrefix("poisonttl"), bucket.WithFailClosed())
	for _, p := range poisons {
		key := "poison:" + p.name
		_, err := b.Reserve(t.Context(), key, bucket.N(1), 0)
		require.NoError(t, err)
		p.apply(t, b, key)
		_, err = b.Reserve(t.Context(), key, bucket.N(1), bucket.Unlimited)
		require.NoError(t, err)
	}
	names, err := rdb.Keys(t.Context(), "poisonttl:*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, names)
	for _, name := range names {
		ttl, err := rdb.PTTL(t.Context(), name).Result()
		require.NoError(t, err)
		assert.Positive(t, ttl, name)
		assert.LessOrEqual(t, ttl, 120*time.Second+time.Minute+5*time.Second, name)
	}
}

// TestClockStepsBack: Redis TIME stepping back an hour (a failover to a
// replica whose clock lags) delays no call, and during a pause delays it by
// at most the horizon.
func TestClockStepsBack(t *testing.T) {
	srv := newClockedRedis(t, epoch)
	rdb := srv.rdb
	b := bucket.NewRedis(rdb, bucket.PerSecond(10), bucket.WithFailClosed())
	ctx := t.Context()

	for range 10 {
		_, err := b.Reserve(ctx, "k", bucket.N(1), 0)
		require.NoError(t, err)
	}
	// A decrease, dated now.
	one := bucket.NewRedis(rdb, bucket.PerSecond(10), bucket.WithFailClosed(),
		bucket.WithPolicy(adaptive.Policy{Threshold: 1}))
	require.NoError(t, one.Observe(ctx, "k", adaptive.Feedback{Class: adaptive.RateLimited}))
	srv.clock.Set(epoch.Add(-time.Hour))
	r, err := b.Reserve(ctx, "k", bucket.N(1), bucket.Unlimited)
	require.NoError(t, err)
	assert.Less(t, r.Delay, time.Second, "not an hour")
	g, _ := gap(t, b, "k")
	assert.Equal(t, 100*time.Millisecond, g, "the decrease from the other clock is forgotten")

	srv.clock.Set(epoch)
	require.NoError(t, b.Observe(ctx, "p", adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: 5 * time.Second}))
	srv.clock.Set(epoch.Add(-time.Hour))
	r, err = b.Reserve(ctx, "p", bucket.N(1), bucket.Unlimited)
	require.NoError(t, err)
	assert.LessOrEqual(t, r.Delay, 120*time.Second, "at most the horizon")
}

// TestDelaysSaturate: waits past the longest Duration (292 years) saturate
// on every backend, and such a wait is refused, never wrapped to a negative
// delay that admits at once; Local and Redis agree to the reservation.
func TestDelaysSaturate(t *testing.T) {
	admitted := map[string]int{}
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			b := be.new(t, bucket.Limit{Rate: 1e-6, Burst: 30}) // 347 days to refill
			require.NoError(t, b.Observe(t.Context(), "k", adaptive.Feedback{Class: adaptive.RateLimited,
				RetryAfter: 100000 * time.Hour}))
			var last time.Duration
			for i := range 400 {
				r, err := b.Reserve(t.Context(), "k", bucket.N(30), bucket.Unlimited)
				require.NoError(t, err)
				if !r.OK {
					assert.Equal(t, bucket.Unlimited, r.RetryAfter, "saturated")
					admitted[be.name] = i
					break
				}
				require.GreaterOrEqual(t, r.Delay, last, "reservation %d", i)
				last = r.Delay
			}
			assert.Greater(t, last, 250*365*24*time.Hour)
		})
	}
	assert.Equal(t, admitted["local"], admitted["redis"])
	assert.NotZero(t, admitted["local"])
}

// TestLocalForgetsOnceRefusedKeys: a key that saw one 429 is forgotten once
// its count has expired and it is full again, like any idle key.
func TestLocalForgetsOnceRefusedKeys(t *testing.T) {
	clk := &fakeClock{t: epoch}
	b := bucket.NewLocal(bucket.PerSecond(10), bucket.WithClock(clk))
	for i := range 2000 {
		key := "k" + strconv.Itoa(i)
		require.NoError(t, b.Observe(t.Context(), key, adaptive.Feedback{Class: adaptive.RateLimited}))
	}
	clk.Advance(10 * time.Second)
	for i := range 2000 {
		_, err := b.Reserve(t.Context(), "other"+strconv.Itoa(i), bucket.N(1), 0)
		require.NoError(t, err)
	}
	assert.Less(t, b.Len(), 3000, "the once-refused keys are swept")
}
