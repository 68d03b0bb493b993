package bucket_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/law"
)

// gap drains key and returns the time between two successive reserved
// slots, 1/rate, and the epoch of the second reservation.
func gap(t *testing.T, b bucket.Bucket, key string) (time.Duration, uint64) {
	t.Helper()
	ctx := context.Background()
	var prev bucket.Reservation
	for i := 0; ; i++ {
		r, err := b.Reserve(ctx, key, bucket.N(1), bucket.Unlimited)
		require.NoError(t, err)
		require.True(t, r.OK)
		if i > 0 && r.Delay > prev.Delay && prev.Delay > 0 {
			return r.Delay - prev.Delay, r.Epoch
		}
		prev = r
		require.Less(t, i, 1000, "the bucket never ran dry")
	}
}

// rateLimited is a 429 of a request reserved at epoch that says
// Retry-After: 0: it counts toward a decrease and pauses nothing.
func rateLimited(epoch uint64) adaptive.Feedback {
	return adaptive.Feedback{Class: adaptive.RateLimited, HasRetryAfter: true, Epoch: epoch}
}

// TestObserve runs the adaptive behaviour against every token bucket
// backend under controlled time: Local and the Lua scripts must agree.
func TestObserve(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			// 10/s, window 1 s: a recovery spans 60 s, epochs are 1 s apart.
			lim := bucket.PerSecond(10)

			// One refusal is enough to halve the rate, in most of these tests.
			one := bucket.WithPolicy(adaptive.Policy{Threshold: 1, Decrease: 0.5})

			t.Run("one decrease per epoch", func(t *testing.T) {
				b := be.new(t, lim, one)
				g, e := gap(t, b, "epoch")
				assert.Equal(t, 100*time.Millisecond, g)
				assert.Zero(t, e)
				// Many workers see 429s for requests of epoch 0: one decrease.
				for range 5 {
					require.NoError(t, b.Observe(ctx, "epoch", rateLimited(0)))
				}
				g, e = gap(t, b, "epoch")
				assert.Equal(t, 200*time.Millisecond, g, "halved once")
				assert.Equal(t, uint64(1), e)
				// A 429 of epoch 1 within MinEpoch of the decrease: no more.
				require.NoError(t, b.Observe(ctx, "epoch", rateLimited(1)))
				g, _ = gap(t, b, "epoch")
				assert.Equal(t, 200*time.Millisecond, g)
				be.advance(1500 * time.Millisecond)
				// Old epochs never count again; the current one does.
				require.NoError(t, b.Observe(ctx, "epoch", rateLimited(0)))
				g, e = gap(t, b, "epoch")
				assert.Equal(t, uint64(1), e)
				assert.InDelta(t, 200*time.Millisecond, g, float64(time.Millisecond))
				require.NoError(t, b.Observe(ctx, "epoch", rateLimited(1)))
				g, e = gap(t, b, "epoch")
				assert.Equal(t, uint64(2), e)
				assert.InDelta(t, 400*time.Millisecond, g, float64(5*time.Millisecond), "halved again")
			})

			t.Run("floor", func(t *testing.T) {
				b := be.new(t, lim, bucket.WithPolicy(adaptive.Policy{Threshold: 1, Decrease: 0.5, Floor: 0.2, MinEpoch: -1}))
				for e := range uint64(6) {
					require.NoError(t, b.Observe(ctx, "floor", rateLimited(e)))
					be.advance(time.Microsecond)
				}
				g, e := gap(t, b, "floor")
				assert.Equal(t, uint64(6), e)
				assert.InDelta(t, 500*time.Millisecond, g, float64(time.Millisecond), "2/s: 20% of 10/s")
			})

			t.Run("recovery", func(t *testing.T) {
				for _, rec := range []adaptive.Recovery{adaptive.Cubic, adaptive.Additive} {
					p := law.WithDefaults(adaptive.Policy{Recovery: rec, Threshold: 1})
					b := be.new(t, lim, bucket.WithPolicy(p))
					key := "recover-" + rec.String()
					require.NoError(t, b.Observe(ctx, key, rateLimited(0)))
					span := time.Duration(p.RecoveryWindows) * time.Second // window: 1 s
					var now time.Duration
					for _, at := range []time.Duration{0, 5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second} {
						be.advance(at - now)
						now = at
						want := law.Fraction(p, p.Decrease, at, span) * 10
						g, _ := gap(t, b, key)
						assert.InEpsilon(t, 1/want, g.Seconds(), 0.001, "%v at %v", rec, at)
					}
				}
			})

			t.Run("a reported rate replaces what refusals taught; the burst scales", func(t *testing.T) {
				b := be.new(t, lim, one)
				require.NoError(t, b.Observe(ctx, "reported", rateLimited(0)))
				be.advance(2 * time.Second)
				assert.InDelta(t, 5, be.tokens(t, "reported")[bucket.Requests], 0.01, "half the rate, half the burst")
				g, _ := gap(t, b, "reported")
				assert.InDelta(t, 200*time.Millisecond, g, float64(time.Millisecond))
				require.NoError(t, b.Observe(ctx, "reported", adaptive.Feedback{Class: adaptive.RateLimited, Epoch: 1,
					Quotas: map[string]adaptive.Quota{bucket.Requests: {Limit: 8, Remaining: 0, Window: time.Second}}}))
				be.advance(900 * time.Millisecond) // the debt of the slots reserved at 5/s is gone
				g, e := gap(t, b, "reported")
				assert.Equal(t, 125*time.Millisecond, g, "the reported 8/s, not halved")
				assert.Equal(t, uint64(1), e)
			})

			t.Run("cold start", func(t *testing.T) {
				b := be.new(t, lim, bucket.WithPolicy(adaptive.Policy{ColdStart: true}))
				// The first reservation goes at once, however large; the rest
				// follow at the rate, with no burst.
				r, err := b.Reserve(ctx, "cold", bucket.N(4), 0)
				require.NoError(t, err)
				assert.True(t, r.OK)
				assert.Zero(t, r.Delay)
				for i := range 3 {
					r, err := b.Reserve(ctx, "cold", bucket.N(1), bucket.Unlimited)
					require.NoError(t, err)
					assert.Equal(t, time.Duration(i+1)*100*time.Millisecond, r.Delay, "reservation %d", i+2)
				}
				// Idle, it fills up to its burst as any bucket does.
				be.advance(2 * time.Second)
				r, err = b.Reserve(ctx, "cold", bucket.N(10), 0)
				require.NoError(t, err)
				assert.True(t, r.OK, "the burst, once earned")
				// A key first met by a refund or an observation starts empty too.
				require.NoError(t, b.Adjust(ctx, "cold-adjust", bucket.N(-2)))
				assert.InDelta(t, 2, be.tokens(t, "cold-adjust")[bucket.Requests], 1e-6)
			})

			t.Run("threshold: refusals within two windows", func(t *testing.T) {
				b := be.new(t, lim, bucket.WithPolicy(adaptive.Policy{Decrease: 0.5})) // threshold 3
				for range 2 {
					require.NoError(t, b.Observe(ctx, "threshold", rateLimited(0)))
					be.advance(1200 * time.Millisecond)
				}
				// The third comes 2.4 s after the first, past two windows of
				// 1 s: the count starts over.
				require.NoError(t, b.Observe(ctx, "threshold", rateLimited(0)))
				_, e := gap(t, b, "threshold")
				assert.Zero(t, e, "no decrease")
				require.NoError(t, b.Observe(ctx, "threshold", rateLimited(0)))
				require.NoError(t, b.Observe(ctx, "threshold", rateLimited(0)))
				g, e := gap(t, b, "threshold")
				assert.Equal(t, uint64(1), e, "three within two windows")
				assert.InDelta(t, 200*time.Millisecond, g, float64(time.Millisecond))
			})

			t.Run("threshold: the time paused is not counted", func(t *testing.T) {
				// One process that learns of each pause at once draws one
				// refusal per pause: 1.6 s apart, each pausing the key 1 s.
				// Three span 3.2 s of the clock but 1.2 s of sending.
				b := be.new(t, lim, bucket.WithPolicy(adaptive.Policy{Decrease: 0.5})) // threshold 3
				refused := adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: time.Second}
				for range 2 {
					require.NoError(t, b.Observe(ctx, "paused", refused))
					be.advance(1600 * time.Millisecond)
				}
				require.NoError(t, b.Observe(ctx, "paused", refused))
				g, e := gap(t, b, "paused")
				assert.Equal(t, uint64(1), e, "three within two windows of sending")
				assert.InDelta(t, 200*time.Millisecond, g, float64(time.Millisecond))
			})

			t.Run("a 429 that asks no wait pauses a window of the limit, at most a second", func(t *testing.T) {
				// What a limiter counting over its window, refusals too,
				// needs to forget; the first slot after it is the rate's.
				first := func(b bucket.Bucket, key string) time.Duration {
					r, err := b.Reserve(ctx, key, bucket.N(1), bucket.Unlimited)
					require.NoError(t, err)
					require.True(t, r.OK)
					return r.Delay
				}
				for _, c := range []struct {
					name  string
					lim   bucket.Limit
					fb    adaptive.Feedback
					delay time.Duration
				}{
					{"per second", lim, adaptive.Feedback{Class: adaptive.RateLimited}, 1100 * time.Millisecond},
					{"a window of 0.2 s", bucket.Limit{Rate: 10, Burst: 2}, adaptive.Feedback{Class: adaptive.RateLimited}, 300 * time.Millisecond},
					{"per minute: a second", bucket.PerMinute(600), adaptive.Feedback{Class: adaptive.RateLimited}, 1100 * time.Millisecond},
					{"Retry-After: 0", lim, adaptive.Feedback{Class: adaptive.RateLimited, HasRetryAfter: true}, 0},
					{"a Retry-After", lim, adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: 3 * time.Second, HasRetryAfter: true}, 3100 * time.Millisecond},
					{"overloaded", lim, adaptive.Feedback{Class: adaptive.Overloaded}, 0},
					{"quota exhausted", lim, adaptive.Feedback{Class: adaptive.QuotaExhausted}, 0},
					// The quota speaks instead: none left, 10 a second.
					{"a quota", lim, adaptive.Feedback{Class: adaptive.RateLimited,
						Quotas: map[string]adaptive.Quota{bucket.Requests: {Limit: 10, Remaining: 0, Window: time.Second}}}, 100 * time.Millisecond},
				} {
					b := be.new(t, c.lim)
					key := "unasked-" + strings.ReplaceAll(c.name, " ", "-")
					require.NoError(t, b.Observe(ctx, key, c.fb))
					assert.Equal(t, c.delay, first(b, key), c.name)
				}
			})

			t.Run("pause spreads what is reserved during it", func(t *testing.T) {
				b := be.new(t, lim)
				require.NoError(t, b.Observe(ctx, "pause", adaptive.Feedback{Class: adaptive.Overloaded, RetryAfter: 2 * time.Second}))
				for i := range 3 {
					r, err := b.Reserve(ctx, "pause", bucket.N(1), bucket.Unlimited)
					require.NoError(t, err)
					assert.Equal(t, 2*time.Second+time.Duration(i+1)*100*time.Millisecond, r.Delay, "waiter %d", i)
				}
				r, err := b.Reserve(ctx, "pause", bucket.N(1), time.Second)
				require.NoError(t, err)
				assert.False(t, r.OK, "a wait beyond maxWait takes nothing")
				assert.Equal(t, 2400*time.Millisecond, r.RetryAfter)
				// Overloaded is not a reason to slow down: no decrease.
				_, e := gap(t, b, "pause")
				assert.Zero(t, e)
			})

			t.Run("pause keeps the slots reserved before it", func(t *testing.T) {
				b := be.new(t, lim)
				// Five slots reserved, 100 to 500 ms ahead, then a pause of
				// 200 ms: the slots due during it are spent (their holders send
				// them or drop them), those after it keep their times, and the
				// next slot comes after them, not 200 ms later.
				reserve := func(key string, n int) time.Duration {
					r, err := b.Reserve(ctx, key, bucket.N(float64(n)), bucket.Unlimited)
					require.NoError(t, err)
					return r.Delay
				}
				reserve("debt", 10)
				assert.Equal(t, 500*time.Millisecond, reserve("debt", 5))
				require.NoError(t, b.Observe(ctx, "debt", adaptive.Feedback{Class: adaptive.Overloaded, RetryAfter: 200 * time.Millisecond}))
				assert.InDelta(t, 600*time.Millisecond, reserve("debt", 1), float64(time.Millisecond), "after the slots reserved before")
				// A pause longer than the debt: empty at its end.
				reserve("short-debt", 10)
				reserve("short-debt", 2)
				require.NoError(t, b.Observe(ctx, "short-debt", adaptive.Feedback{Class: adaptive.Overloaded, RetryAfter: time.Second}))
				assert.InDelta(t, 1100*time.Millisecond, reserve("short-debt", 1), float64(time.Millisecond))
			})

			t.Run("hold: a rate kept for HoldWindows is cut to no lower, on one refusal", func(t *testing.T) {
				b := be.new(t, lim, bucket.WithPolicy(adaptive.Policy{Decrease: 0.5, HoldWindows: 5})) // threshold 3
				for range 3 {
					require.NoError(t, b.Observe(ctx, "hold", rateLimited(0)))
				}
				g, e := gap(t, b, "hold")
				require.Equal(t, uint64(1), e)
				require.Equal(t, 200*time.Millisecond, g)
				// 6 s later the rate has climbed a little (cubic); one refusal
				// takes it back to 5/s, which it kept, not to half of that.
				be.advance(6 * time.Second)
				require.NoError(t, b.Observe(ctx, "hold", rateLimited(1)))
				g, e = gap(t, b, "hold")
				assert.Equal(t, uint64(2), e, "one refusal")
				assert.InDelta(t, 200*time.Millisecond, g, float64(time.Millisecond), "back to the held rate")
				// Refusals going on within the hold: the threshold, then a full cut.
				be.advance(1500 * time.Millisecond)
				for i := range 3 {
					_, e = gap(t, b, "hold")
					assert.Equal(t, uint64(2), e, "refusal %d", i+1)
					require.NoError(t, b.Observe(ctx, "hold", rateLimited(2)))
				}
				g, e = gap(t, b, "hold")
				assert.Equal(t, uint64(3), e)
				assert.InDelta(t, 400*time.Millisecond, g, float64(time.Millisecond), "halved")
			})

			t.Run("clamp to remaining and reported limit", func(t *testing.T) {
				b := be.new(t, lim)
				require.NoError(t, b.Observe(ctx, "quota", adaptive.Feedback{Quotas: map[string]adaptive.Quota{
					bucket.Requests: {Limit: 4, Remaining: 2, Window: time.Second, Reset: 3 * time.Second},
				}}))
				assert.InDelta(t, 2, be.tokens(t, "quota")[bucket.Requests], 1e-6)
				g, _ := gap(t, b, "quota")
				assert.Equal(t, 250*time.Millisecond, g, "the reported 4/s")
				be.advance(1500 * time.Millisecond) // the report counts until its reset
				assert.InDelta(t, 4, be.tokens(t, "quota")[bucket.Requests], 1e-6, "refills to the reported burst")
				// A report from another dimension or an unknown remaining
				// changes nothing here.
				require.NoError(t, b.Observe(ctx, "quota", adaptive.Feedback{Quotas: map[string]adaptive.Quota{
					bucket.Tokens:   {Limit: 1, Remaining: 0},
					bucket.Requests: {Remaining: -1},
				}}))
				assert.InDelta(t, 4, be.tokens(t, "quota")[bucket.Requests], 1e-6)
			})

			t.Run("a report older than what was spent since does not raise what is left", func(t *testing.T) {
				b := be.new(t, bucket.PerSecond(20))
				// 600 a minute, whole again at 10/s.
				perMinute := func(rem float64) adaptive.Feedback {
					return adaptive.Feedback{Quotas: map[string]adaptive.Quota{
						bucket.Requests: {Limit: 600, Remaining: rem, Reset: time.Duration((600 - rem) / 10 * float64(time.Second))}}}
				}
				require.NoError(t, b.Observe(ctx, "openai", perMinute(3)))
				require.NoError(t, b.Observe(ctx, "openai", perMinute(500)))
				assert.InDelta(t, 3, be.tokens(t, "openai")[bucket.Requests], 1e-6)
				g, _ := gap(t, b, "openai")
				assert.Equal(t, 100*time.Millisecond, g, "the provider's 10/s")
			})

			t.Run("the provider's bucket is a constraint, not a cap on the rate", func(t *testing.T) {
				// Ours 20/s with a burst of 20; the provider reports 600 a
				// minute (10/s) with 30 left. What the provider has left goes
				// at our rate; then its 10/s paces the rest.
				b := be.new(t, bucket.PerSecond(20))
				require.NoError(t, b.Observe(ctx, "bucket", adaptive.Feedback{Quotas: map[string]adaptive.Quota{
					bucket.Requests: {Limit: 600, Remaining: 30, Reset: 57 * time.Second}}}))
				for k := 1; k <= 60; k++ {
					r, err := b.Reserve(ctx, "bucket", bucket.N(1), bucket.Unlimited)
					require.NoError(t, err)
					require.True(t, r.OK)
					// Ours is ready at (k-20)/20 s, the provider's at (k-30)/10 s.
					want := max(time.Duration(k-20)*50*time.Millisecond, time.Duration(k-30)*100*time.Millisecond, 0)
					assert.Equal(t, want, r.Delay, "call %d", k)
				}
			})

			t.Run("quota exhausted and empty feedback change nothing", func(t *testing.T) {
				b := be.new(t, lim)
				require.NoError(t, b.Observe(ctx, "noop", adaptive.Feedback{Class: adaptive.QuotaExhausted}))
				require.NoError(t, b.Observe(ctx, "noop", adaptive.Feedback{}))
				g, e := gap(t, b, "noop")
				assert.Equal(t, 100*time.Millisecond, g)
				assert.Zero(t, e)
			})
		})
	}
}
