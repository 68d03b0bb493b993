package bucket_test

// Tests of slots that move up (WaitMax), from a review of a change that
// moved every waiter up by the refunds since its reservation (a place in a
// count of the queue, not shipped): each failed on it, or on the re-reads
// it brought.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// wrapped is a Bucket wrapped as users wrap one (a ledger, a logger:
// examples/llmfleet's ledger): it has the Bucket methods only, so WaitMax
// cancels its waits with Adjust.
type wrapped struct{ bucket.Bucket }

// TestUnservedRefundMovesNoWaiterAhead: a reservation that is never
// served and gives its cost back with Adjust (the public way to drop a
// Reserve, and what WaitMax does on a bucket that is not a token bucket of
// sluice's, such as a user's wrapper) must not move up a waiter ahead of
// it: the capacity it gives back is its own slot's, after the waiter's.
//
// At 10/s with a burst of 20, the key is emptied, W waits for 20 (slot
// 2 s), X reserves 20 behind it (slot 4 s) and gives it back. W counts X
// among what was reserved after it (q - place), and X's refund in the
// tokens: it wakes at once (local, same process) or at its first re-read,
// 0.5 s (another process): 40 admitted in under 0.6 s, where the bucket
// allows 20 + 10·0.6 = 26.
func TestUnservedRefundMovesNoWaiterAhead(t *testing.T) {
	l := bucket.Limit{Rate: 10, Burst: 20}
	rdb := redistest.Client(t)
	type tc struct {
		w, x bucket.Bucket // W's process, X's
		via  string        // how X gives its cost back
	}
	r1 := bucket.NewRedis(rdb, l, bucket.WithFailClosed())
	r2 := bucket.NewRedis(redistest.Client(t), l, bucket.WithFailClosed())
	loc := bucket.NewLocal(l)
	cases := map[string]tc{
		"local/adjust":            {loc, loc, "adjust"},
		"local/wrapped-cancel":    {loc, wrapped{loc}, "cancel"},
		"redis/adjust":            {r1, r1, "adjust"},
		"redis/other-process":     {r1, r2, "adjust"},
		"redis/wrapped-cancelled": {r1, wrapped{r2}, "cancel"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			key := uniqueKey(t)
			start := time.Now()
			r, err := c.w.Reserve(ctx, key, bucket.N(20), 0) // empty
			require.NoError(t, err)
			require.True(t, r.OK)
			woke := make(chan time.Duration, 1)
			go func() {
				_, err := bucket.WaitMax(ctx, c.w, key, bucket.N(20), time.Minute)
				assert.NoError(t, err)
				woke <- time.Since(start)
			}()
			time.Sleep(50 * time.Millisecond) // W reserves first
			switch c.via {
			case "adjust":
				r, err := c.x.Reserve(ctx, key, bucket.N(20), time.Minute)
				require.NoError(t, err)
				require.True(t, r.OK)
				require.Greater(t, r.Delay, 3*time.Second, "X is behind W")
				require.NoError(t, c.x.Adjust(ctx, key, bucket.N(-20))) // X will not go
			case "cancel":
				xctx, cancel := context.WithCancel(ctx)
				time.AfterFunc(100*time.Millisecond, cancel)
				_, err := bucket.WaitMax(xctx, c.x, key, bucket.N(20), time.Minute)
				require.ErrorIs(t, err, context.Canceled)
			}
			w := <-woke
			t.Logf("W woke at %v (its slot: 2 s)", w)
			assert.GreaterOrEqual(t, w, 1900*time.Millisecond,
				"W admitted before its slot: 40 by %v, the bucket allows %.0f", w, l.Burst+l.Rate*w.Seconds())
		})
	}
}

// TestShareWaitersKeepTheirSlotsWhenRedisReturns: a wait that a fail-open
// share reserved has no place on Redis, and its re-reads (every 0.5 s at
// least, unasked) ask Redis for the end of Redis's queue, which does not
// hold the share's reservations (they are owed, and debited only by the
// process's next Reserve). Once Redis is back, every waiter queued on the
// share moves to Redis's end of the queue, now on a key Redis has full:
// at 10/s, burst 10, one member, 10 waiters of 5 on an empty share (slots
// 0.5 to 5 s) all go by about 1 s while the fleet's other process spends
// Redis's burst too. The fleet's bound across an outage is Burst + Rate·T
// + Burst/n (WithFailOpen).
func TestShareWaitersKeepTheirSlotsWhenRedisReturns(t *testing.T) {
	srv := redistest.Own(t)
	p := redistest.NewProxy(t, srv.Addr)
	l := bucket.Limit{Rate: 10, Burst: 10}
	reader, mp := newReader(t)
	a := bucket.NewRedis(fastClient(t, p.Addr), l, bucket.WithFailOpen(), bucket.WithMeterProvider(mp))
	other := bucket.NewRedis(fastClient(t, srv.Addr), l, bucket.WithFailClosed())
	ctx := context.Background()
	key := uniqueKey(t)
	// Contact, so that the outage is one (the share of one member).
	_, err := a.Reserve(ctx, "warm", bucket.N(1), 0)
	require.NoError(t, err)
	p.Refuse(true)
	p.ResetAll()

	var mu sync.Mutex
	var admitted []time.Duration // at each 5 admitted by a's waiters
	start := time.Now()
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			r, err := bucket.WaitMax(ctx, a, key, bucket.N(5), time.Minute)
			if assert.NoError(t, err) && assert.True(t, r.OK) {
				mu.Lock()
				admitted = append(admitted, time.Since(start))
				mu.Unlock()
			}
		})
		time.Sleep(5 * time.Millisecond)
	}
	require.Eventually(t, func() bool { // every waiter reserved on the share
		pt := points(t, reader)
		return pt["sluice.bucket.waiters{}"] == 10 && pt["sluice.bucket.decisions{decision=delayed,served_by=share}"] == 10
	}, 5*time.Second, 10*time.Millisecond)
	p.Refuse(false) // Redis is back: once a call of a's works (on another key: nothing settled)
	require.Eventually(t, func() bool {
		_, err := a.Tokens(ctx, "warm")
		return err == nil
	}, 3*time.Second, 50*time.Millisecond)
	// The other process takes Redis's burst.
	r, err := other.Reserve(ctx, key, bucket.N(10), 0)
	require.NoError(t, err)
	require.True(t, r.OK)
	wg.Wait()
	slices.Sort(admitted)
	t.Logf("share waiters admitted at %v", admitted)
	// Over [0, T] the fleet took 10 (the other's) + 5 per waiter by T.
	for i, at := range admitted {
		took := 10 + 5*float64(i+1)
		bound := l.Burst + l.Rate*at.Seconds() + l.Burst + 5 // + the share's burst, + one call for timing
		assert.LessOrEqual(t, took, bound, "by %v the fleet took %.0f, its bound is %.0f", at, took, bound)
	}
}

// TestWaitReadsPerAdmission: the cost of moving up. N waiters of one
// process on a key, a queue of 6 s, each call refunding half its cost at
// its end and telling the bucket it was accepted (as the transport does):
// every refund wakes every waiter whose slot is far off, and those a
// refund wakes share one read of the end of the queue. Before they
// shared it, each read: 18.5-24.8 reads per waiter at 60 waiters,
// 30.3-44.5 at 120.
func TestWaitReadsPerAdmission(t *testing.T) {
	for _, waiters := range []int{60, 120} {
		t.Run(fmt.Sprint(waiters), func(t *testing.T) {
			rdb := redistest.Client(t)
			var counter commandCounter
			rdb.AddHook(&counter)
			l := bucket.PerSecond(float64(waiters) / 3) // 2 each: a queue of 6 s
			b := bucket.NewRedis(rdb, l, bucket.WithFailClosed())
			ctx := context.Background()
			key := uniqueKey(t)
			_, err := b.Reserve(ctx, key, bucket.N(l.Burst), 0) // empty
			require.NoError(t, err)
			counter.n.Store(0)
			var wg sync.WaitGroup
			for range waiters {
				wg.Go(func() {
					_, err := bucket.WaitMax(ctx, b, key, bucket.N(2), time.Minute)
					if !assert.NoError(t, err) {
						return
					}
					time.Sleep(20 * time.Millisecond) // the call
					assert.NoError(t, b.Adjust(ctx, key, bucket.N(-1)))
					assert.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.Accepted,
						Quotas: map[string]adaptive.Quota{}}))
				})
				time.Sleep(time.Millisecond)
			}
			wg.Wait()
			n := counter.n.Load()
			// One reservation and one refund per call are 2 (an Observe
			// with nothing to learn makes no call); the reads are the rest.
			perCall := float64(n)/float64(waiters) - 2
			t.Logf("%d script calls for %d waiters: %.1f reads per waiter", n, waiters, perCall)
			assert.LessOrEqual(t, perCall, 4.0, "reads per waiter")
		})
	}
}

// TestFleetConservationWithRefundsAndCancels: three processes (buckets of
// their own on one Redis) with goroutines that wait, a quarter of the waits
// given up (cancelled), the others refunding part of their cost after their
// call (Settle: every waiter moves up by it): from the start, what was
// admitted is at most Burst + Rate·T plus the refunds of calls served, at
// every admission. The waits given up go
// through WaitMax on the bucket itself (cancel), or on a wrapper of it
// (the refund of a cancelled wait is an Adjust then; the other waits are
// on the bucket itself): the second run fails.
func TestFleetConservationWithRefundsAndCancels(t *testing.T) {
	l := bucket.Limit{Rate: 40, Burst: 20}
	for _, wrap := range []bool{false, true} {
		t.Run(fmt.Sprintf("wrapped=%v", wrap), func(t *testing.T) {
			var procs []bucket.Bucket
			for range 3 {
				procs = append(procs, bucket.NewRedis(redistest.Client(t), l, bucket.WithFailClosed()))
			}
			fleetConservation(t, l, procs, wrap)
		})
	}
	// One process's Local, its goroutines in three groups.
	t.Run("local", func(t *testing.T) {
		loc := bucket.NewLocal(l)
		fleetConservation(t, l, []bucket.Bucket{loc, loc, loc}, false)
	})
}

func fleetConservation(t *testing.T, l bucket.Limit, procs []bucket.Bucket, wrap bool) {
	key := uniqueKey(t)
	ctx := context.Background()
	type event struct {
		at     time.Duration
		admit  float64 // charged, admitted
		refund float64 // refunded, of a call served
	}
	var mu sync.Mutex
	var events []event
	add := func(e event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	start := time.Now()
	end := start.Add(4 * time.Second)
	var cancelled atomic.Int64
	var wg sync.WaitGroup
	for p, pb := range procs {
		for g := range 8 {
			rng := rand.New(rand.NewPCG(uint64(p), uint64(g)))
			wg.Go(func() {
				for time.Now().Before(end) {
					cost := float64(1 + rng.IntN(8))
					var b bucket.Bucket = pb
					wctx, cancel := ctx, context.CancelFunc(func() {})
					if rng.IntN(4) == 0 {
						wctx, cancel = context.WithCancel(ctx)
						time.AfterFunc(time.Duration(100+rng.IntN(900))*time.Millisecond, cancel)
						if wrap {
							b = wrapped{pb}
						}
					}
					_, err := bucket.WaitMax(wctx, b, key, bucket.N(cost), 10*time.Second)
					cancel()
					if err != nil {
						cancelled.Add(1)
						continue
					}
					add(event{at: time.Since(start), admit: cost})
					time.Sleep(time.Duration(10+rng.IntN(40)) * time.Millisecond) // the call
					if used := float64(rng.IntN(int(cost) + 1)); used < cost {
						assert.NoError(t, bucket.Settle(ctx, pb, key, bucket.N(used-cost)))
						add(event{at: time.Since(start), refund: cost - used})
					}
				}
			})
		}
	}
	wg.Wait()
	slices.SortFunc(events, func(a, b event) int { return int(a.at - b.at) })
	var admitted, refunded float64
	worst, worstAt := -l.Burst, time.Duration(0)
	for _, e := range events {
		admitted += e.admit
		refunded += e.refund
		// A waiter wakes a little after its slot on a loaded machine, and
		// the refund is recorded after the call made it: 50 ms of rate
		// and one call's cost.
		bound := l.Burst + l.Rate*(e.at.Seconds()+0.05) + refunded + 8
		if over := admitted - bound; over > worst {
			worst, worstAt = over, e.at
		}
	}
	t.Logf("admitted %.0f, refunded %.0f, cancelled %d, over %.1f s: admitted - bound at most %.1f (at %v)",
		admitted, refunded, cancelled.Load(), time.Since(start).Seconds(), worst, worstAt)
	assert.LessOrEqual(t, worst, 0.0, "admitted beyond Burst + Rate·T + refunds")
}

// TestSlowRedisReadKeepsNoWaiterLate: a waiter re-reads its slot with a
// call to Redis in its own goroutine, and its timer is not heard while the
// call is under way: on a Redis that is slow but correct (a round trip of
// 800 ms), a slot that comes during a re-read is kept late by what is left
// of the call. At 10/s, a waiter of 10 on an empty key holds a slot 1 s
// after its reply; its first re-read starts at 0.5 s and ends at 1.3 s.
func TestSlowRedisReadKeepsNoWaiterLate(t *testing.T) {
	p := redistest.NewProxy(t, redistest.Addr(t))
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	b := bucket.NewRedis(rdb, bucket.Limit{Rate: 10, Burst: 20}, bucket.WithFailClosed(), bucket.WithRedisTimeout(5*time.Second))
	ctx := context.Background()
	key := uniqueKey(t)
	r, err := b.Reserve(ctx, key, bucket.N(20), 0) // empty, and the scripts loaded
	require.NoError(t, err)
	require.True(t, r.OK)
	p.SetLatency(400 * time.Millisecond)
	start := time.Now()
	r, err = bucket.WaitMax(ctx, b, key, bucket.N(14), time.Minute)
	require.NoError(t, err)
	took := time.Since(start)
	// The reservation's own round trip is 800 ms: the reply comes then,
	// and the slot r.Delay after the server ran it, 400 ms before.
	late := took - 400*time.Millisecond - r.Delay - 400*time.Millisecond
	t.Logf("delay %v, WaitMax took %v: %v after the slot", r.Delay, took, late)
	assert.Less(t, late, 150*time.Millisecond, "woke late")
}
