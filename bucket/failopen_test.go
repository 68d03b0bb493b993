package bucket_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// fleetOf returns the first of n buckets on srv with lim, each counted as
// a member of its own, once all have beaten: the one that counted the
// fleet last, n members.
func fleetOf(t *testing.T, srv *redistest.Server, n int, lim bucket.Limit) *bucket.Redis {
	t.Helper()
	clk := &fakeClock{t: time.Now()}
	rdb := fastClient(t, srv.Addr)
	var first *bucket.Redis
	for i := range n {
		b := bucket.NewRedis(rdb, lim, bucket.WithClock(clk), bucket.WithMemberID(string(rune('a'+i))))
		_, err := b.Reserve(t.Context(), "warm", bucket.N(lim.Burst/1000), 0)
		require.NoError(t, err)
		if first == nil {
			first = b
		}
	}
	clk.Advance(time.Second)
	_, err := first.Reserve(t.Context(), "warm", bucket.N(lim.Burst/1000), 0)
	require.NoError(t, err)
	require.Equal(t, int64(n), bucket.Members(first))
	return first
}

// TestShareChargesLargeCostsInFull: a cost beyond the share's burst is
// charged in full; a debit's cap was the share's burst, not the bucket's,
// and a fleet of 4 got twice its limit (a step of 200 s, not 400 s).
func TestShareChargesLargeCostsInFull(t *testing.T) {
	srv := redistest.Own(t)
	b := fleetOf(t, srv, 4, bucket.Limit{Rate: 1, Burst: 100})
	srv.Stop()
	var last time.Duration
	for i := range 4 {
		r, err := b.Reserve(t.Context(), "big", bucket.N(100), bucket.Unlimited)
		require.NoError(t, err)
		require.True(t, r.OK)
		if i > 0 {
			assert.InDelta(t, 400*time.Second, r.Delay-last, float64(time.Second), "100 at the share's 0.25/s")
		}
		last = r.Delay
	}
}

// TestTinyShareDoesNotPanic: a share below the least Limit (10 a day
// among 116 processes) used to panic the caller.
func TestTinyShareDoesNotPanic(t *testing.T) {
	srv := redistest.Own(t)
	b := fleetOf(t, srv, 11, bucket.Limit{Rate: 1e-5, Burst: 1})
	srv.Stop()
	assert.NotPanics(t, func() {
		_, err := b.Reserve(t.Context(), "k", bucket.N(1), bucket.Unlimited)
		assert.NoError(t, err)
	})
}

// TestShareStartsEachKeyAfterItsOwnSlots: the share starts a key after the
// last slot this process holds on Redis for that key, not for any key (one
// key 59 s deep in debt held every other back for 59 s).
func TestShareStartsEachKeyAfterItsOwnSlots(t *testing.T) {
	srv := redistest.Own(t)
	rdb := fastClient(t, srv.Addr)
	b := bucket.NewRedis(rdb, bucket.PerSecond(10))
	for range 60 {
		_, err := b.Reserve(t.Context(), "slow", bucket.N(10), bucket.Unlimited)
		require.NoError(t, err)
	}
	srv.Stop()
	r, err := b.Reserve(t.Context(), "other", bucket.N(1), 5*time.Second)
	require.NoError(t, err)
	assert.True(t, r.OK)
	assert.LessOrEqual(t, r.Delay, 200*time.Millisecond)
	r, err = b.Reserve(t.Context(), "slow", bucket.N(1), time.Minute)
	require.NoError(t, err)
	assert.True(t, r.OK)
	assert.Greater(t, r.Delay, 50*time.Second, "after the slots reserved on Redis")
}

// TestBogusReplyDoesNotMoveTheShare: a reserve reply the scripts never
// give is an error, and moves nothing: it used to start every key's share
// a day late.
func TestBogusReplyDoesNotMoveTheShare(t *testing.T) {
	fake := startFakeRedis(t, ":86400000000")
	b := bucket.NewRedis(fastClient(t, fake.addr), bucket.PerSecond(10), bucket.WithEvictionAllowed())
	_, err := b.Reserve(t.Context(), "a", bucket.N(1), time.Second)
	require.ErrorContains(t, err, "unexpected reply")
	loading := "-LOADING Redis is loading the dataset in memory"
	fake.reply.Store(&loading) // unavailable from now on
	r, err := b.Reserve(t.Context(), "b", bucket.N(1), time.Minute)
	require.NoError(t, err)
	assert.True(t, r.OK)
	assert.LessOrEqual(t, r.Delay, 200*time.Millisecond, "%+v, members %d", r, bucket.Members(b))
}

// TestReportsReplaceAndExpire: a report replaces the last one (a stale
// reported rate came back with a burst-only report on Redis), and a
// report counts until its own reset (Local kept the longest), on both
// backends alike.
func TestReportsReplaceAndExpire(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			b := be.new(t, bucket.Limit{Rate: 1, Burst: 100})
			ctx := t.Context()
			q := func(q adaptive.Quota) adaptive.Feedback {
				return adaptive.Feedback{Quotas: map[string]adaptive.Quota{bucket.Requests: q}}
			}
			// A rate of 0.1/s for 500 s, then, after it, a burst alone.
			require.NoError(t, b.Observe(ctx, "k", q(adaptive.Quota{Limit: 50, Remaining: -1, Window: 500 * time.Second})))
			be.advance(600 * time.Second)
			require.NoError(t, b.Observe(ctx, "k", q(adaptive.Quota{Limit: 100, Remaining: -1})))
			g, _ := gap(t, b, "k")
			assert.Equal(t, time.Second, g, "the configured 1/s")

			// A report for 60 s (its rate floored), then one for a window.
			require.NoError(t, b.Observe(ctx, "j", q(adaptive.Quota{Limit: 1, Remaining: -1, Window: 60 * time.Second})))
			be.advance(5 * time.Second)
			require.NoError(t, b.Observe(ctx, "j", q(adaptive.Quota{Limit: 100, Remaining: -1})))
			be.advance(101 * time.Second)
			g, _ = gap(t, b, "j")
			assert.Equal(t, time.Second, g, "the last report, run out")
		})
	}
}

// TestReportsAgree: Local and the scripts agree on the provider's bucket
// after a remaining-only report (Lua forgot the bucket), an idle time (the
// hash expired before the provider's bucket refilled) and a rate below
// what the scripts keep (it was stored as 0 and made inf).
func TestReportsAgree(t *testing.T) {
	got := map[string][]float64{}
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			q := func(q adaptive.Quota) adaptive.Feedback {
				return adaptive.Feedback{Quotas: map[string]adaptive.Quota{bucket.Requests: q}}
			}
			b := be.new(t, bucket.PerSecond(20))
			require.NoError(t, b.Observe(ctx, "k", q(adaptive.Quota{Limit: 600, Remaining: 0, Window: time.Minute})))
			require.NoError(t, b.Observe(ctx, "k", q(adaptive.Quota{Remaining: 500})))
			got[be.name] = append(got[be.name], be.tokens(t, "k")[bucket.Requests])
			be.advance(10 * time.Second)
			_, err := b.Reserve(ctx, "k", bucket.N(20), bucket.Unlimited)
			require.NoError(t, err)
			be.advance(time.Second)
			got[be.name] = append(got[be.name], be.tokens(t, "k")[bucket.Requests])

			slow := be.new(t, bucket.Limit{Rate: 0.1, Burst: 1})
			require.NoError(t, slow.Observe(ctx, "s", q(adaptive.Quota{Limit: 1, Remaining: 0.99, Reset: 24 * time.Hour})))
			r, err := slow.Reserve(ctx, "s", bucket.N(1), time.Minute)
			require.NoError(t, err)
			got[be.name] = append(got[be.name], max(r.Delay, r.RetryAfter).Seconds())
		})
	}
	t.Log(got)
	require.Len(t, got["local"], 3)
	for i := range got["local"] {
		assert.InDelta(t, got["local"][i], got["redis"][i], 0.01, "step %d", i)
	}
	assert.Positive(t, got["local"][2], "a wait, not 'retry now'")
}

// redisBack waits until b reaches srv again after a restart, and the
// breaker (timeout 50 ms) lets calls through.
func redisBack(t *testing.T, srv *redistest.Server, b bucket.Bucket) {
	t.Helper()
	require.NoError(t, srv.Restart())
	require.Eventually(t, func() bool {
		_, err := b.Reserve(t.Context(), "probe", bucket.N(1), 0)
		return err == nil && scriptsRun(t, srv.Addr, "") > 0 // the restarted server ran a script
	}, 5*time.Second, 20*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
}

var quickBreaker = bucket.WithRedisBreaker(gobreaker.Settings{Timeout: 50 * time.Millisecond})

// TestShareDebtSettledInFull: the slots a share reserved that are still to
// come are debited from Redis whole when it is back; a debit's cap of a
// burst left 90 of 100 queued slots double-booked.
func TestShareDebtSettledInFull(t *testing.T) {
	srv := redistest.Own(t)
	rdb := fastClient(t, srv.Addr)
	b := bucket.NewRedis(rdb, bucket.PerSecond(10), quickBreaker)
	_, err := b.Reserve(t.Context(), "k", bucket.N(1), 0)
	require.NoError(t, err)
	srv.Stop()
	for range 100 {
		r, err := b.Reserve(t.Context(), "k", bucket.N(1), bucket.Unlimited)
		require.NoError(t, err)
		require.True(t, r.OK)
	}
	redisBack(t, srv, b)
	_, err = b.Reserve(t.Context(), "k", bucket.N(1), bucket.Unlimited) // settles
	require.NoError(t, err)
	tk, err := b.Tokens(t.Context(), "k")
	require.NoError(t, err)
	assert.Less(t, tk[bucket.Requests], -80.0, "the share's queue, still to come, is Redis's debt")
}

// TestFlappingRedisHandsNoTimeOutTwice: a share made after Redis came back
// and failed again starts each key after the last share's queue, and owes
// what that one did not settle. Before, each new share started after the
// slots on Redis only: the second outage's share handed out again the time
// the first one had queued. With a provider's bucket learnt during the
// first outage (60 a minute, 10 left), the queue is the provider's, 20 s
// deep at its 1/s where ours is 2 s at 10/s: the second share starts after
// that one.
func TestFlappingRedisHandsNoTimeOutTwice(t *testing.T) {
	for _, c := range []struct {
		name    string
		report  bool
		atLeast time.Duration // the first share's last slot
	}{{"own queue", false, 2 * time.Second}, {"the provider's bucket's queue", true, 15 * time.Second}} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Own(t)
			rdb := fastClient(t, srv.Addr)
			b := bucket.NewRedis(rdb, bucket.PerSecond(10), quickBreaker)
			ctx := t.Context()
			_, err := b.Reserve(ctx, "warm", bucket.N(1), 0)
			require.NoError(t, err)
			srv.Stop()
			if c.report {
				_, err = b.Reserve(ctx, "k", bucket.N(1), bucket.Unlimited) // the share, empty
				require.NoError(t, err)
				require.NoError(t, b.Observe(ctx, "k", adaptive.Feedback{Quotas: map[string]adaptive.Quota{
					bucket.Requests: {Limit: 60, Remaining: 10, Window: time.Minute}}}))
			}
			var last time.Duration
			for range 30 { // 3 s of queue on the first share, or 20 s at the provider's 1/s
				r, err := b.Reserve(ctx, "k", bucket.N(1), bucket.Unlimited)
				require.NoError(t, err)
				last = r.Delay
			}
			require.Greater(t, last, c.atLeast)
			start := time.Now()
			redisBack(t, srv, b) // "k" is not called: nothing settles it
			srv.Stop()
			r, err := b.Reserve(ctx, "k", bucket.N(1), bucket.Unlimited)
			require.NoError(t, err)
			assert.GreaterOrEqual(t, r.Delay+time.Since(start), last,
				"the second share starts after the first one's queue")
		})
	}
}

// TestWindowBucketsSettleTheirShares: a window bucket that failed open
// settles its share's debt once Redis is back; it had no way to, and the
// first call that worked panicked on a nil Bucket.
func TestWindowBucketsSettleTheirShares(t *testing.T) {
	for name, mk := range map[string]func(rdb redis.UniversalClient) bucket.Bucket{
		"FixedWindow": func(rdb redis.UniversalClient) bucket.Bucket {
			return bucket.NewFixedWindow(rdb, bucket.PerMinute(600), quickBreaker)
		},
		"SlidingLog": func(rdb redis.UniversalClient) bucket.Bucket {
			return bucket.NewSlidingLog(rdb, bucket.PerMinute(600), quickBreaker)
		},
	} {
		t.Run(name, func(t *testing.T) {
			srv := redistest.Own(t)
			b := mk(fastClient(t, srv.Addr))
			ctx := t.Context()
			_, err := b.Reserve(ctx, "warm", bucket.N(1), 0)
			require.NoError(t, err)
			srv.Stop()
			for range 5 {
				r, err := b.Reserve(ctx, "k", bucket.N(1), bucket.Unlimited)
				require.NoError(t, err)
				require.True(t, r.OK)
			}
			redisBack(t, srv, b)
			require.NotPanics(t, func() {
				_, err = b.Reserve(ctx, "k", bucket.N(1), 0)
			})
			require.NoError(t, err)
			tk, err := tokensOf(ctx, b, "k")
			require.NoError(t, err)
			assert.InDelta(t, 600-6, tk[bucket.Requests], 0.5, "the share's 5, and this one")
		})
	}
}

// tokensOf is the Tokens of a Redis-backed bucket.
func tokensOf(ctx context.Context, b bucket.Bucket, key string) (bucket.Cost, error) {
	return b.(interface {
		Tokens(context.Context, string) (bucket.Cost, error)
	}).Tokens(ctx, key)
}

// TestOutageLogged: an outage's start is logged at warn level, saying what
// calls do meanwhile, and its end at info; before, failing open was silent
// unless the caller set OnStateChange.
func TestOutageLogged(t *testing.T) {
	for _, closed := range []bool{false, true} {
		srv := redistest.Own(t)
		var log syncBuffer
		opts := []bucket.Option{quickBreaker, bucket.WithLogger(slog.New(slog.NewTextHandler(&log, nil)))}
		want := "take this process's share"
		if closed {
			opts, want = append(opts, bucket.WithFailClosed()), "fail with ErrUnavailable"
		}
		b := bucket.NewRedis(fastClient(t, srv.Addr), bucket.PerSecond(10), opts...)
		_, err := b.Reserve(t.Context(), "k", bucket.N(1), 0)
		require.NoError(t, err)
		srv.Stop()
		_, _ = b.Reserve(t.Context(), "k", bucket.N(1), 0)
		redisBack(t, srv, b)
		out := log.String()
		assert.Equal(t, 1, strings.Count(out, "level=WARN"), out)
		assert.Zero(t, strings.Count(out, "level=ERROR"), "a Redis once reached is down, not misconfigured: %s", out)
		assert.Contains(t, out, want)
		assert.Contains(t, out, "addr="+srv.Addr)
		assert.Contains(t, out, "level=INFO msg=\"sluice: redis serves the bucket again\"")
	}
}

// TestNeverReachedRedisLoggedAsError: a Redis address where nothing listens
// is reported by the first call at error level, with the address and what to
// check, as the likely misconfiguration it is, while that call and the next
// are served by the share; it was one warn line, "redis unavailable", as for
// an outage.
func TestNeverReachedRedisLoggedAsError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	var log syncBuffer
	b := bucket.NewRedis(fastClient(t, addr), bucket.PerSecond(10), quickBreaker,
		bucket.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	for i := range 2 {
		r, err := b.Reserve(t.Context(), "k", bucket.N(1), time.Minute) // a share starts empty
		require.NoError(t, err, "call %d", i)
		assert.True(t, r.OK, "call %d: served by the share", i)
		if i == 0 {
			out := log.String()
			assert.Equal(t, 1, strings.Count(out, "level=ERROR"), out)
			assert.Contains(t, out, "addr="+addr)
			assert.Contains(t, out, "check the address")
			assert.Zero(t, strings.Count(out, "level=WARN"), out)
		}
	}
}
