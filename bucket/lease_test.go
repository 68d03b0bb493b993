package bucket_test

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// leaseRedis returns a client of a redis-server of the test's own, whose
// script calls redistest.ScriptCalls counts.
func leaseRedis(t *testing.T) *redis.Client {
	t.Helper()
	srv := redistest.Own(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// warm makes b's first contact with Redis, which may run a script.
func warm(t *testing.T, b *bucket.Redis) {
	t.Helper()
	leaseTokens(t, b, "warm")
}

func leaseTokens(t *testing.T, b *bucket.Redis, key string) bucket.Cost {
	t.Helper()
	c, err := b.Tokens(t.Context(), key)
	require.NoError(t, err)
	return c
}

func TestWithLeasingValidates(t *testing.T) {
	for _, c := range []struct {
		k   int
		ttl time.Duration
	}{{1, 100 * time.Millisecond}, {10_001, 100 * time.Millisecond}, {100, 0}, {100, 5 * time.Millisecond}, {100, 2 * time.Second}} {
		assert.PanicsWithValue(t,
			"bucket: WithLeasing("+strconv.Itoa(c.k)+", "+c.ttl.String()+"): k is between 2 and 10000, ttl between 10ms and 1s",
			func() { bucket.WithLeasing(c.k, c.ttl) })
	}
	assert.NotPanics(t, func() { bucket.WithLeasing(2, 10*time.Millisecond) })
	assert.NotPanics(t, func() { bucket.WithLeasing(10_000, time.Second) })
}

// TestLeaseServesLocallyAndGivesBack: the first Reserve takes a lease of k
// calls in one script call, the next k-1 make none, the one after takes a
// new lease; what a lease did not hand out goes back to the key at its ttl.
func TestLeaseServesLocallyAndGivesBack(t *testing.T) {
	rdb := leaseRedis(t)
	ctx := t.Context()
	const ttl = 100 * time.Millisecond
	lim := bucket.Limit{Rate: 1, Burst: 1000} // refills 0.1 a ttl: a give back stands out
	b := bucket.NewRedis(rdb, lim, bucket.WithLeasing(100, ttl))
	t.Cleanup(func() { b.Close() })
	warm(t, b)
	calls0 := redistest.ScriptCalls(t, rdb)
	for i := range 100 {
		r, err := b.Reserve(ctx, "k", bucket.N(1), 0)
		require.NoError(t, err)
		require.True(t, r.OK)
		require.Zero(t, r.Delay)
		if i == 0 {
			assert.Equal(t, calls0+1, redistest.ScriptCalls(t, rdb), "the first takes a lease")
		}
	}
	assert.Equal(t, calls0+1, redistest.ScriptCalls(t, rdb), "the lease serves k calls")
	assert.InDelta(t, 900, leaseTokens(t, b, "k")[bucket.Requests], 0.5)
	calls0 = redistest.ScriptCalls(t, rdb)

	// WaitMax (reserveAt) is served by the next lease too.
	for range 10 {
		r, err := bucket.WaitMax(ctx, b, "k", bucket.N(1), time.Second)
		require.NoError(t, err)
		require.True(t, r.OK)
	}
	assert.Equal(t, calls0+1, redistest.ScriptCalls(t, rdb), "one lease for ten WaitMax")
	assert.InDelta(t, 800, leaseTokens(t, b, "k")[bucket.Requests], 0.5)

	// Idle: the 90 left go back at the ttl.
	time.Sleep(ttl + 100*time.Millisecond)
	assert.InDelta(t, 890, leaseTokens(t, b, "k")[bucket.Requests], 0.5)
}

// TestLeaseCloseGivesBack: Close gives back what leases hold, and the
// bucket reserves plainly after it.
func TestLeaseCloseGivesBack(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
	rdb := leaseRedis(t)
	ctx := t.Context()
	b := bucket.NewRedis(rdb, bucket.Limit{Rate: 1, Burst: 1000}, bucket.WithLeasing(100, time.Second))
	for _, key := range []string{"a", "b"} {
		_, err := b.Reserve(ctx, key, bucket.N(1), 0)
		require.NoError(t, err)
		assert.InDelta(t, 900, leaseTokens(t, b, key)[bucket.Requests], 0.5)
	}
	require.NoError(t, b.Close())
	for _, key := range []string{"a", "b"} {
		assert.InDelta(t, 999, leaseTokens(t, b, key)[bucket.Requests], 0.5)
	}
	require.NoError(t, b.Close(), "a second Close does nothing")
	calls0 := redistest.ScriptCalls(t, rdb)
	_, err := b.Reserve(ctx, "a", bucket.N(1), 0)
	require.NoError(t, err)
	assert.Equal(t, calls0+1, redistest.ScriptCalls(t, rdb))
	assert.InDelta(t, 998, leaseTokens(t, b, "a")[bucket.Requests], 0.5)
}

// TestLeasePausedByAnotherProcess: a pause that another process observes
// reaches this one's lease within its ttl: after it, no call is admitted
// and no lease taken until the pause ends.
func TestLeasePausedByAnotherProcess(t *testing.T) {
	rdb := leaseRedis(t)
	ctx := t.Context()
	const ttl = 100 * time.Millisecond
	lim := bucket.Limit{Rate: 100, Burst: 1000}
	a := bucket.NewRedis(rdb, lim, bucket.WithLeasing(100, ttl))
	t.Cleanup(func() { a.Close() })
	other := bucket.NewRedis(rdb, lim)
	r, err := a.Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	require.True(t, r.OK)
	leased := time.Now()
	require.NoError(t, other.Observe(ctx, "k", adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: 2 * time.Second}))
	var last time.Time
	var after int
	for time.Since(leased) < 3*ttl {
		r, err := a.Reserve(ctx, "k", bucket.N(1), 0)
		require.NoError(t, err)
		if r.OK {
			last = time.Now()
			after++
		} else {
			assert.Greater(t, r.RetryAfter, time.Second, "the pause's")
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("%d calls served from the lease after the pause, the last %v after the lease", after, last.Sub(leased))
	assert.Less(t, after, 100, "no more than the lease held")
	assert.Less(t, last.Sub(leased), ttl+20*time.Millisecond, "the pause reaches the lease within its ttl")
	// The lease's remainder went back into a paused key: lost, as a
	// refund's during a pause.
	assert.LessOrEqual(t, leaseTokens(t, a, "k")[bucket.Requests], 0.0)
}

// TestLeaseDroppedByOwnRefusal: a process's own Observe of a refusal drops
// its lease, without giving it back, and the key gets plain reservations.
func TestLeaseDroppedByOwnRefusal(t *testing.T) {
	rdb := leaseRedis(t)
	ctx := t.Context()
	b := bucket.NewRedis(rdb, bucket.Limit{Rate: 1, Burst: 1000}, bucket.WithLeasing(100, time.Second))
	t.Cleanup(func() { b.Close() })
	_, err := b.Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	require.NoError(t, b.Observe(ctx, "k", adaptive.Feedback{Class: adaptive.RateLimited, HasRetryAfter: true}))
	calls0 := redistest.ScriptCalls(t, rdb)
	r, err := b.Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	require.True(t, r.OK)
	assert.Equal(t, calls0+1, redistest.ScriptCalls(t, rdb), "a plain reservation")
	assert.InDelta(t, 899, leaseTokens(t, b, "k")[bucket.Requests], 0.5, "the lease was not given back")
	require.NoError(t, b.Close())
	assert.InDelta(t, 899, leaseTokens(t, b, "k")[bucket.Requests], 0.5, "nor at Close")
}

// TestLeaseEpochAndDecrease: a decrease that another process makes
// reaches the next lease, whose calls carry its epoch.
func TestLeaseEpochAndDecrease(t *testing.T) {
	rdb := leaseRedis(t)
	ctx := t.Context()
	lim := bucket.Limit{Rate: 1, Burst: 1000}
	a := bucket.NewRedis(rdb, lim, bucket.WithLeasing(100, 50*time.Millisecond))
	t.Cleanup(func() { a.Close() })
	other := bucket.NewRedis(rdb, lim)
	r, err := a.Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	assert.Zero(t, r.Epoch)
	for range 3 { // the default threshold
		require.NoError(t, other.Observe(ctx, "k", adaptive.Feedback{Class: adaptive.RateLimited, HasRetryAfter: true}))
	}
	time.Sleep(100 * time.Millisecond) // a's lease expires
	r, err = a.Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	require.True(t, r.OK)
	assert.Equal(t, uint64(1), r.Epoch)
	r, err = a.Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), r.Epoch, "a leased call has the lease's epoch")
	// Cut to 0.7 of the burst, less the first lease, and less the second.
	assert.InDelta(t, 0.7*1000-100, leaseTokens(t, a, "k")[bucket.Requests], 1)
}

// TestLeaseTwoDimensions: a lease takes n calls of the cost in each
// dimension, n at most k and at most a quarter of each burst.
func TestLeaseTwoDimensions(t *testing.T) {
	rdb := leaseRedis(t)
	ctx := t.Context()
	b := bucket.NewRedis(rdb, bucket.Limit{Rate: 1, Burst: 1000}, bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 1, Burst: 100_000}),
		bucket.WithLeasing(100, time.Second))
	t.Cleanup(func() { b.Close() })
	cost := bucket.Cost{bucket.Requests: 1, bucket.Tokens: 500} // 50 calls: a quarter of the tokens' burst
	warm(t, b)
	calls0 := redistest.ScriptCalls(t, rdb)
	for range 50 {
		r, err := b.Reserve(ctx, "k", cost, 0)
		require.NoError(t, err)
		require.True(t, r.OK)
	}
	assert.Equal(t, calls0+1, redistest.ScriptCalls(t, rdb))
	tk := leaseTokens(t, b, "k")
	assert.InDelta(t, 950, tk[bucket.Requests], 0.5)
	assert.InDelta(t, 75_000, tk[bucket.Tokens], 0.5)
	// A bigger call than the lease holds takes a new one, giving back the
	// old's remainder (none here) in the same call; one that a lease could
	// hold only once is plain.
	_, err := b.Reserve(ctx, "k", bucket.Cost{bucket.Requests: 1, bucket.Tokens: 20_000}, 0)
	require.NoError(t, err)
	tk = leaseTokens(t, b, "k")
	assert.InDelta(t, 949, tk[bucket.Requests], 0.5)
	assert.InDelta(t, 55_000, tk[bucket.Tokens], 0.5)
	// Invalid costs are the plain path's errors.
	_, err = b.Reserve(ctx, "k", bucket.Cost{bucket.Requests: 1, bucket.Tokens: -1}, 0)
	require.ErrorIs(t, err, bucket.ErrInvalidCost)
	_, err = b.Reserve(ctx, "", bucket.N(1), 0)
	require.ErrorIs(t, err, bucket.ErrInvalidKey)
}

// TestLeaseConcurrent: goroutines that share leases under -race stay
// within Burst + Rate*T + L (one process, L the lease), and leave no
// goroutine behind after Close.
func TestLeaseConcurrent(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
	rdb := leaseRedis(t)
	ctx := t.Context()
	lim := bucket.Limit{Rate: 2000, Burst: 400}
	const k = 20
	b := bucket.NewRedis(rdb, lim, bucket.WithLeasing(k, 20*time.Millisecond))
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 16 {
		wg.Go(func() {
			for time.Since(start) < time.Second {
				r, err := bucket.WaitMax(ctx, b, "k", bucket.N(1), 0)
				if err == nil && r.OK {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	span := time.Since(start)
	require.NoError(t, b.Close())
	bound := lim.Burst + lim.Rate*span.Seconds()
	t.Logf("admitted %d of bound %.0f (+%d)", admitted.Load(), bound, k)
	assert.LessOrEqual(t, float64(admitted.Load()), bound+k+1)
}

// TestLeaseHandsOutEachTokenOnce: goroutines that share a key's leases
// under -race, with two costs (so that a lease of one is given back in the
// call that takes one of the other), through some hundred leases and a
// Close in their midst, are admitted exactly what Redis was charged: no
// leased token is handed out twice, and none is lost (every one not
// handed out goes back). The key refills 0.01 a second: what it has after
// is Burst less what was admitted.
func TestLeaseHandsOutEachTokenOnce(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
	rdb := leaseRedis(t)
	ctx := t.Context()
	lim := bucket.Limit{Rate: 0.01, Burst: 40_000}
	const k, closeAt, stopAt = 100, 12_000, 14_000
	b := bucket.NewRedis(rdb, lim, bucket.WithLeasing(k, time.Second))
	warm(t, b)
	calls0 := redistest.ScriptCalls(t, rdb)
	var admitted, delayed atomic.Int64
	var stop atomic.Bool
	closing := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for i := range 32 {
		cost := bucket.N(1)
		if i%8 == 0 {
			cost = bucket.N(2)
		}
		wg.Go(func() {
			for !stop.Load() {
				r, err := b.Reserve(ctx, "k", cost, 0)
				if err != nil {
					t.Error(err)
					return
				}
				if !r.OK {
					continue
				}
				if r.Delay != 0 {
					delayed.Add(1)
				}
				n := admitted.Add(int64(cost[bucket.Requests]))
				if n >= closeAt {
					once.Do(func() { close(closing) })
				}
				if n >= stopAt {
					stop.Store(true)
				}
			}
		})
	}
	<-closing
	leasedCalls := redistest.ScriptCalls(t, rdb) - calls0
	require.NoError(t, b.Close())
	wg.Wait()
	t.Logf("admitted %d, %d script calls for the first %d", admitted.Load(), leasedCalls, closeAt)
	assert.Less(t, leasedCalls, int64(closeAt/10), "leases served most calls")
	assert.Zero(t, delayed.Load())
	assert.InDelta(t, lim.Burst-float64(admitted.Load()), leaseTokens(t, b, "k")[bucket.Requests], 0.5)
}
