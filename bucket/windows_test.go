package bucket_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

const day = "requests/24h0m0s"

// TestWindows: a daily cap beside a per-minute limit. A call takes from
// both, all or nothing, and waits for the one that refills last; the day
// is neither cut by the law, nor paused, nor reported on.
func TestWindows(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := context.Background()
			key := "windows-" + be.name
			b := be.new(t, bucket.PerMinute(60), bucket.WithWindow(bucket.Requests, bucket.PerDay(100)))
			for range 60 {
				r, err := b.Reserve(ctx, key, bucket.N(1), 0)
				require.NoError(t, err)
				require.True(t, r.OK)
			}
			assert.Equal(t, bucket.Cost{bucket.Requests: 0, day: 40}, be.tokens(t, key))
			r, err := b.Reserve(ctx, key, bucket.N(1), 0)
			require.NoError(t, err)
			assert.False(t, r.OK)
			assert.Equal(t, time.Second, r.RetryAfter, "the minute refills first")

			// 40 more over 40 s: the day is spent; the next waits for it.
			be.advance(40 * time.Second)
			r, err = b.Reserve(ctx, key, bucket.N(40), 0)
			require.NoError(t, err)
			require.True(t, r.OK)
			be.advance(20 * time.Second)
			r, err = b.Reserve(ctx, key, bucket.N(1), 0)
			require.NoError(t, err)
			assert.False(t, r.OK)
			assert.InDelta(t, 864-60, r.RetryAfter.Seconds(), 1, "a day's refill of one request, less the minute since the first call")

			// Refusals cut the minute, not the day; a pause holds the
			// minute, and the day refills through it.
			for range 3 {
				require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: 10 * time.Second}))
			}
			require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
				bucket.Requests: {Limit: 60, Remaining: 5, Reset: time.Minute}}}))
			assert.LessOrEqual(t, be.tokens(t, key)[bucket.Requests], 0.0, "the minute paused")
			be.advance(10 * time.Second)
			assert.InDelta(t, 70.0/864, be.tokens(t, key)[day], 1e-4, "the day untouched but for its refill")
		})
	}
}

// A window lives two of its lengths after its last write, longer than it
// takes to refill (see windowsSeen): two days for a daily cap; the
// minute's key a minute or two.
func TestWindowLastsItsRefill(t *testing.T) {
	cr := newClockedRedis(t, epoch)
	b := bucket.NewRedis(cr.rdb, bucket.PerMinute(60), bucket.WithWindow(bucket.Requests, bucket.PerDay(1000)))
	_, err := b.Reserve(context.Background(), "ttl", bucket.N(500), 0)
	assert.ErrorIs(t, err, bucket.ErrExceedsBurst, "more than the minute's burst")
	r, err := b.Reserve(context.Background(), "ttl", bucket.N(50), 0)
	require.NoError(t, err)
	require.True(t, r.OK)
	ttl := cr.TTL("sluice:{ttl}:" + day)
	assert.Greater(t, ttl, 2*24*time.Hour, "two days: more than the 1.2 h it takes to refill 50 of 1,000 a day")
	assert.Less(t, ttl, 2*24*time.Hour+2*time.Minute, "and a minute's margin")
	assert.Less(t, cr.TTL("sluice:{ttl}:requests"), 3*time.Minute)
}

// A window starts full after a cold start, where the dimension starts
// empty: it would hold the key to a day's refill.
func TestWindowStartsFull(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			p := adaptive.DefaultPolicy()
			p.ColdStart = true
			b := be.new(t, bucket.PerMinute(60), bucket.WithWindow(bucket.Requests, bucket.PerDay(100)), bucket.WithPolicy(p))
			r, err := b.Reserve(context.Background(), "cold-"+be.name, bucket.N(1), time.Minute)
			require.NoError(t, err)
			require.True(t, r.OK)
			assert.Equal(t, bucket.Cost{bucket.Requests: 0, day: 99}, be.tokens(t, "cold-"+be.name))
		})
	}
}

// The window buckets take windows too.
func TestFixedWindowWithWindows(t *testing.T) {
	cr := newClockedRedis(t, epoch)
	b := bucket.NewFixedWindow(cr.rdb, bucket.PerSecond(5), bucket.WithWindow(bucket.Requests, bucket.PerMinute(8)))
	ctx := context.Background()
	admitted := 0
	for range 4 {
		for range 10 {
			if r, err := b.Reserve(ctx, "fw", bucket.N(1), 0); err == nil && r.OK {
				admitted++
			}
		}
		cr.clock.Advance(time.Second)
	}
	assert.Equal(t, 8, admitted, "5, then 3 until the minute is spent")
}

func TestWindowMisconfigured(t *testing.T) {
	assert.PanicsWithError(t, `bucket: invalid limit 0.001/s burst 10 for "tokens": a window of a dimension that has no limit (give it WithLimit)`, func() {
		bucket.NewLocal(bucket.PerSecond(1), bucket.WithWindow(bucket.Tokens, bucket.Limit{Rate: 0.001, Burst: 10}))
	})
	assert.Panics(t, func() {
		bucket.NewLocal(bucket.PerSecond(1), bucket.WithWindow(bucket.Requests, bucket.PerDay(10)), bucket.WithWindow(bucket.Requests, bucket.PerDay(20)))
	}, "two windows of a day")
	assert.Panics(t, func() { bucket.NewLocal(bucket.PerSecond(1), bucket.WithWindow(bucket.Requests, bucket.Limit{})) })
}

// TestWindowSettlesAnOutage: what a share admitted in an outage is debited
// from the day once Redis serves again, all of it. The settlement owed the
// dimension what the share still queued plus at most the minute's burst of
// what had come due (which the minute, but not the day, refilled
// meanwhile), and the day forgot the rest: 300 calls in a five-minute
// outage cost it 60.
func TestWindowSettlesAnOutage(t *testing.T) {
	srv := redistest.Own(t)
	clk := &fakeClock{t: time.Now()}
	b := bucket.NewRedis(fastClient(t, srv.Addr), bucket.PerMinute(60),
		bucket.WithWindow(bucket.Requests, bucket.PerDay(1000)), bucket.WithClock(clk), quickBreaker)
	ctx := t.Context()
	_, err := b.Reserve(ctx, "warm", bucket.N(1), 0)
	require.NoError(t, err)
	srv.Stop()
	r, err := b.Reserve(ctx, "k", bucket.N(1), 0) // opens the share, empty
	require.NoError(t, err)
	require.False(t, r.OK)
	admitted := 0
	for range 5 {
		clk.Advance(time.Minute) // the share refills its minute
		for range 100 {
			if r, err := b.Reserve(ctx, "k", bucket.N(1), 0); err == nil && r.OK {
				admitted++
			}
		}
	}
	require.Equal(t, 300, admitted, "the share's minute, five times")
	redisBack(t, srv, b)                         // a restart: Redis lost the day, which the settlement must bring back
	r, err = b.Reserve(ctx, "k", bucket.N(1), 0) // settles
	require.NoError(t, err)
	require.True(t, r.OK)
	tk, err := b.Tokens(ctx, "k")
	require.NoError(t, err)
	assert.InDelta(t, 1000-300-1, tk[day], 1, "the outage's calls, and this one")
}

// TestWindowKeptThroughAnAdjustInAPause: an Adjust while the key is paused
// leaves a window as it was: the Local backend (and so a share in an
// outage) emptied every window, as it empties the paused dimension, and a
// refund of a few tokens cost the day its allowance.
func TestWindowKeptThroughAnAdjustInAPause(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := context.Background()
			key := "pause-adjust-" + be.name
			b := be.new(t, bucket.PerMinute(60), bucket.WithWindow(bucket.Requests, bucket.PerDay(100)))
			r, err := b.Reserve(ctx, key, bucket.N(10), 0)
			require.NoError(t, err)
			require.True(t, r.OK)
			require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: 10 * time.Second}))
			require.NoError(t, b.Adjust(ctx, key, bucket.N(-1)))
			be.advance(10 * time.Second)
			assert.InDelta(t, 91, be.tokens(t, key)[day], 0.1, "the day's 90, the refund, and 10 s of its refill")
		})
	}
}

// TestWindowNotRefilledByAFlappingRedis: each outage's share starts the
// key's windows where the last share left them, not full again: a Redis
// that flapped handed a fresh day to every share, and three outages took
// three days' calls.
func TestWindowNotRefilledByAFlappingRedis(t *testing.T) {
	srv := redistest.Own(t)
	clk := &fakeClock{t: time.Now()}
	b := bucket.NewRedis(fastClient(t, srv.Addr), bucket.PerMinute(60),
		bucket.WithWindow(bucket.Requests, bucket.PerDay(50)), bucket.WithClock(clk), quickBreaker)
	ctx := t.Context()
	_, err := b.Reserve(ctx, "warm", bucket.N(1), 0)
	require.NoError(t, err)
	admitted := 0
	for outage := range 3 {
		if outage > 0 {
			redisBack(t, srv, b)
		}
		srv.Stop()
		_, err := b.Reserve(ctx, "k", bucket.N(1), 0) // opens the share
		require.NoError(t, err)
		clk.Advance(time.Minute) // the share refills its minute
		for range 100 {
			if r, err := b.Reserve(ctx, "k", bucket.N(1), 0); err == nil && r.OK {
				admitted++
			}
		}
	}
	assert.LessOrEqual(t, admitted, 51, "one day's share, and what it refilled")
}

// TestWindowOutlivesRedis: a fleet of 3 worker processes (2 goroutines
// each, a call every 5 ms) spends a daily window, PerDay(90), beside
// PerSecond(50); then Redis restarts empty, or freezes for 3 s (SIGSTOP:
// the shares serve). Over the whole run the fleet is admitted at most
// Burst + Rate*T plus one share burst (30): 120. Before, a restart handed
// the fleet the day again (the first call back found no hash and read it
// full: 180 admitted), and a freeze started each process's share with its
// part of a full day (30 each: 180).
func TestWindowOutlivesRedis(t *testing.T) {
	const procs = 3
	dayLimit := bucket.PerDay(90)
	for _, c := range []struct {
		name string
		hit  func(t *testing.T, srv *redistest.Server)
	}{
		{"restarted empty", func(t *testing.T, srv *redistest.Server) {
			srv.Stop()
			require.NoError(t, srv.Restart())
		}},
		{"frozen", func(t *testing.T, srv *redistest.Server) {
			require.NoError(t, srv.Pause())
			time.Sleep(3 * time.Second)
			require.NoError(t, srv.Resume())
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Own(t)
			spec := fleetSpec{
				Addr: srv.Addr, Key: "day-" + c.name, Requests: bucket.PerSecond(50), Day: &dayLimit,
				Goroutines: 2, Duration: 7 * time.Second, PaceFor: 7 * time.Second, PaceEvery: 5 * time.Millisecond,
				Stamps: true, Timeout: 200 * time.Millisecond,
			}
			var hitAt time.Time
			run := runFleetDuring(t, procs, spec, func(start time.Time) {
				time.Sleep(time.Until(start.Add(2 * time.Second))) // the day is spent in about one
				hitAt = time.Now()
				c.hit(t, srv)
			})
			after := 0
			for _, us := range run.stamps {
				if time.UnixMicro(us).After(hitAt) {
					after++
				}
			}
			bound := dayLimit.Burst + dayLimit.Rate*run.span.Seconds() + dayLimit.Burst/procs
			t.Logf("%d admitted in %v (%d after Redis was hit), against Burst + Rate*T + one share burst = %.1f",
				run.admitted, run.span.Round(time.Millisecond), after, bound)
			assert.GreaterOrEqual(t, run.admitted, 90, "the day, spent")
			assert.LessOrEqual(t, float64(run.admitted), bound)
		})
	}
}
