package bucket_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestCoalescedMatchesSerial: 64 goroutines reserving one key at once,
// coalesced, get the slots that 64 calls one after another get, on a
// Redis whose clock stands still: 10 now (the burst), one every 100 ms up
// to their maxWait of 3 s, the rest refused, nothing taken twice or lost;
// in fewer script calls than decisions.
func TestCoalescedMatchesSerial(t *testing.T) {
	srv, _ := redistest.Clocked(t, epoch)
	proxy := redistest.NewProxy(t, srv.Addr)
	proxy.SetLatency(2 * time.Millisecond) // so that calls overlap
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, PoolSize: 64})
	t.Cleanup(func() { rdb.Close() })
	ctx := t.Context()
	lim := bucket.Limit{Rate: 10, Burst: 10}
	const n, maxWait = 64, 3 * time.Second

	outcomes := func(b *bucket.Redis, key string, concurrent bool) []time.Duration {
		out := make([]time.Duration, n)
		one := func(i int) {
			r, err := b.Reserve(ctx, key, bucket.N(1), maxWait)
			assert.NoError(t, err)
			out[i] = r.Delay
			if !r.OK {
				out[i] = -1
			}
		}
		if concurrent {
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { one(i) })
			}
			wg.Wait()
		} else {
			for i := range n {
				one(i)
			}
		}
		slices.Sort(out)
		return out
	}
	serial := outcomes(bucket.NewRedis(rdb, lim, bucket.WithoutCoalescing()), "serial", false)
	calls0 := redistest.ScriptCalls(t, rdb)
	coalesced := outcomes(bucket.NewRedis(rdb, lim), "coalesced", true)
	calls := redistest.ScriptCalls(t, rdb) - calls0

	want := make([]time.Duration, 0, n)
	for range n - 10 - 30 {
		want = append(want, -1)
	}
	for range 10 {
		want = append(want, 0)
	}
	for i := 1; i <= 30; i++ {
		want = append(want, time.Duration(i)*100*time.Millisecond)
	}
	assert.Equal(t, want, serial)
	assert.Equal(t, want, coalesced)
	t.Logf("%d decisions in %d script calls", n, calls)
	assert.Less(t, calls, int64(n))
}

// TestCoalescedConservation: several processes (buckets, each with its own
// client and coalescer) saturate one key from many goroutines, with and
// without waits: the fleet is admitted at most Burst + Rate·T over T, and
// at least 95% of it.
func TestCoalescedConservation(t *testing.T) {
	addr := redistest.Own(t).Addr
	lim := bucket.Limit{Rate: 200, Burst: 50}
	const procs, goroutines, span = 3, 16, 2 * time.Second
	buckets := make([]*bucket.Redis, procs)
	for i := range buckets {
		rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: goroutines})
		t.Cleanup(func() { rdb.Close() })
		buckets[i] = bucket.NewRedis(rdb, lim, bucket.WithFailClosed())
		_, err := buckets[i].Tokens(t.Context(), "warm")
		require.NoError(t, err)
	}
	var admitted, calls atomic.Int64
	scripts0 := redistest.ScriptCalls(t, plainClient(t, addr))
	start := time.Now()
	end := start.Add(span)
	var wg sync.WaitGroup
	for p, b := range buckets {
		for g := range goroutines {
			wg.Go(func() {
				ctx, cancel := context.WithDeadline(t.Context(), end)
				defer cancel()
				for time.Now().Before(end) {
					calls.Add(1)
					var r bucket.Reservation
					var err error
					if (p+g)%2 == 0 {
						r, err = b.Reserve(ctx, "fleet", bucket.N(1), 0)
					} else {
						// Waits, some refused for the deadline: a batch
						// of mixed outcomes.
						r, err = bucket.WaitMax(ctx, b, "fleet", bucket.N(1), 50*time.Millisecond)
						if errors.Is(err, bucket.ErrDeadline) || errors.Is(err, context.DeadlineExceeded) {
							continue
						}
					}
					if ctx.Err() != nil {
						return // the span's end
					}
					if !assert.NoError(t, err) {
						return
					}
					if r.OK && !time.Now().After(end) {
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	scripts := redistest.ScriptCalls(t, plainClient(t, addr)) - scripts0
	t.Logf("%d decisions in %d script calls", calls.Load(), scripts)
	assert.Less(t, scripts, calls.Load(), "coalesced")
	assertConserved(t, lim, admitted.Load(), span, "coalesced, 3 processes")
}

// plainClient is a client of addr for the test's own reads.
func plainClient(t *testing.T, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// coalescing is a key with a call under way that takes latency each way,
// on a Redis whose clock stands still: the reservations that arrive
// meanwhile queue behind it.
type coalescing struct {
	t     *testing.T
	proxy *redistest.Proxy
	rdb   *redis.Client
	b     *bucket.Redis
}

func newCoalescing(t *testing.T, latency time.Duration, lim bucket.Limit, opts ...bucket.Option) *coalescing {
	srv, _ := redistest.Clocked(t, epoch)
	proxy := redistest.NewProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, PoolSize: 16})
	t.Cleanup(func() { rdb.Close() })
	b := bucket.NewRedis(rdb, lim, append([]bucket.Option{bucket.WithRedisTimeout(5 * time.Second)}, opts...)...)
	// The first contact, and a connection for each call under way at once
	// (the leaders'), dialled before the latency.
	var wg sync.WaitGroup
	for range 2 * bucket.MaxCalls {
		wg.Go(func() {
			_, err := b.Tokens(t.Context(), "warm")
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	proxy.SetLatency(latency)
	return &coalescing{t: t, proxy: proxy, rdb: rdb, b: b}
}

// result is a Reserve's outcome, and when it came.
type result struct {
	r   bucket.Reservation
	err error
	at  time.Duration
}

// reserve starts a Reserve of cost from "k" under ctx, after delay.
func (c *coalescing) reserve(ctx context.Context, start time.Time, delay time.Duration, cost float64) <-chan result {
	ch := make(chan result, 1)
	go func() {
		time.Sleep(delay)
		r, err := c.b.Reserve(ctx, "k", bucket.N(cost), 0)
		ch <- result{r, err, time.Since(start)}
	}()
	return ch
}

// leaders starts as many Reserves of 1 as a key may have calls under way
// (bucket.MaxCalls), at once: those that come after them queue.
func (c *coalescing) leaders(start time.Time) []<-chan result {
	var ls []<-chan result
	for range bucket.MaxCalls {
		ls = append(ls, c.reserve(c.t.Context(), start, 0, 1))
	}
	return ls
}

// TestCoalescedCancel: a reservation whose context ends while it queues
// leaves at once, nothing taken; one whose context ends while its batch is
// under way gets its context's error when the batch returns, and what it
// took is refunded; the others of its batch are served.
func TestCoalescedCancel(t *testing.T) {
	const oneWay = 100 * time.Millisecond // a call takes 200 ms
	c := newCoalescing(t, oneWay, bucket.Limit{Rate: 1, Burst: 20}, bucket.WithFailClosed())
	start := time.Now()
	leaders := c.leaders(start)
	queuedCtx, cancelQueued := context.WithCancel(t.Context())
	queued := c.reserve(queuedCtx, start, 30*time.Millisecond, 2)
	inBatchCtx, cancelInBatch := context.WithCancel(t.Context())
	inBatch := c.reserve(inBatchCtx, start, 30*time.Millisecond, 3)
	served := c.reserve(t.Context(), start, 30*time.Millisecond, 4)

	time.Sleep(80 * time.Millisecond)
	cancelQueued()
	q := <-queued
	assert.ErrorIs(t, q.err, context.Canceled)
	assert.Less(t, q.at, 150*time.Millisecond, "left the queue at once")

	time.Sleep(300*time.Millisecond - time.Since(start)) // the batch is under way
	cancelInBatch()
	for _, leader := range leaders {
		l := <-leader
		require.NoError(t, l.err)
		assert.True(t, l.r.OK)
	}
	ib, s := <-inBatch, <-served
	require.NoError(t, s.err)
	assert.True(t, s.r.OK)
	assert.ErrorIs(t, ib.err, context.Canceled)
	assert.Greater(t, ib.at, 350*time.Millisecond, "decided with its batch")

	c.proxy.SetLatency(0)
	tokens, err := c.b.Tokens(t.Context(), "k")
	require.NoError(t, err)
	assert.Equal(t, 20.0-bucket.MaxCalls-4, tokens[bucket.Requests], "the leaders' and the served one's taken, the others' not")
}

// TestCoalescedRedisFailsMidBatch: connections reset while a batch is
// under way fail each of its reservations as a call of its own fails:
// failing open, each is served by this process's share; failing closed,
// each gets an *UnavailableError.
func TestCoalescedRedisFailsMidBatch(t *testing.T) {
	for _, open := range []bool{true, false} {
		t.Run(map[bool]string{true: "fail-open", false: "fail-closed"}[open], func(t *testing.T) {
			opt := bucket.WithFailClosed()
			if open {
				opt = bucket.WithFailOpen()
			}
			const oneWay = 100 * time.Millisecond
			c := newCoalescing(t, oneWay, bucket.Limit{Rate: 1, Burst: 10}, opt)
			start := time.Now()
			leaders := c.leaders(start)
			var batch []<-chan result
			for range 4 {
				batch = append(batch, c.reserve(t.Context(), start, 30*time.Millisecond, 1))
			}
			time.Sleep(300*time.Millisecond - time.Since(start)) // the batch is under way
			c.proxy.ResetAll()
			for _, leader := range leaders {
				l := <-leader
				require.NoError(t, l.err)
				assert.NotEqual(t, uint64(math.MaxUint64), l.r.Epoch, "a leader's call, before the reset, worked")
			}
			for i, ch := range batch {
				res := <-ch
				if open {
					if assert.NoError(t, res.err, "reservation %d", i) {
						assert.Equal(t, uint64(math.MaxUint64), res.r.Epoch, "reservation %d: the share's", i)
					}
				} else {
					assert.ErrorIs(t, res.err, bucket.ErrUnavailable, "reservation %d", i)
				}
			}
		})
	}
}
