package bucket_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// winStart is a moment of today's magnitude (1.8e15 µs, beyond the 14
// digits Lua's tostring keeps) with an odd microsecond: 40.123457 s into a
// minute, 0.123457 s into a 10 s window.
var winStart = time.Unix(1795000000, 123457000)

// winToMinute is the time from winStart to the next minute.
const winToMinute = 19*time.Second + 876543*time.Microsecond

// winRedis is a redis-server whose TIME and key expiry the test drives.
type winRedis struct {
	srv *clockedRedis
	rdb *redis.Client
	now time.Time
}

func newWinRedis(t *testing.T) *winRedis {
	srv := newClockedRedis(t, winStart)
	return &winRedis{srv: srv, rdb: srv.rdb, now: winStart}
}

// advance moves TIME forward by d, and with it the expiry of keys.
func (w *winRedis) advance(d time.Duration) {
	w.now = w.now.Add(d)
	w.srv.clock.Set(w.now)
}

// winIndex is the number of the window of length l that holds at.
func winIndex(at time.Time, l time.Duration) string {
	return strconv.FormatInt(at.UnixMicro()/l.Microseconds(), 10)
}

// winTokens reads Tokens of a FixedWindow or SlidingLog.
func winTokens(t *testing.T, b interface {
	Tokens(context.Context, string) (bucket.Cost, error)
}, key string) bucket.Cost {
	t.Helper()
	c, err := b.Tokens(t.Context(), key)
	require.NoError(t, err)
	return c
}

func winReserve(t *testing.T, b bucket.Bucket, key string, cost bucket.Cost, maxWait time.Duration) bucket.Reservation {
	t.Helper()
	r, err := b.Reserve(t.Context(), key, cost, maxWait)
	require.NoError(t, err)
	return r
}

func TestFixedWindowAllowanceAndRetryAfter(t *testing.T) {
	w := newWinRedis(t)
	b := bucket.NewFixedWindow(w.rdb, bucket.PerMinute(5))
	for i := range 5 {
		assert.Equal(t, bucket.Reservation{OK: true}, winReserve(t, b, "k", bucket.N(1), 0), "call %d", i)
	}
	assert.Equal(t, bucket.Cost{bucket.Requests: 0}, winTokens(t, b, "k"))
	// Full until the minute ends, to the microsecond.
	assert.Equal(t, bucket.Reservation{RetryAfter: winToMinute}, winReserve(t, b, "k", bucket.N(1), 0))
	w.advance(winToMinute - time.Microsecond)
	assert.Equal(t, bucket.Reservation{RetryAfter: time.Microsecond}, winReserve(t, b, "k", bucket.N(1), 0))
	w.advance(time.Microsecond)
	// A new window: the whole allowance again, all at once.
	assert.Equal(t, bucket.Cost{bucket.Requests: 5}, winTokens(t, b, "k"))
	assert.Equal(t, bucket.Reservation{OK: true}, winReserve(t, b, "k", bucket.N(5), 0))
	assert.Equal(t, bucket.Reservation{RetryAfter: time.Minute}, winReserve(t, b, "k", bucket.N(1), 0))
	// A cost that charges no limited dimension is free.
	assert.Equal(t, bucket.Reservation{OK: true}, winReserve(t, b, "k", bucket.Cost{"images": 1e9}, 0))
}

func TestFixedWindowFutureReservations(t *testing.T) {
	w := newWinRedis(t)
	b := bucket.NewFixedWindow(w.rdb, bucket.PerMinute(2))
	rk := "sluice:{k}:requests:window"
	assert.True(t, winReserve(t, b, "k", bucket.N(2), 0).OK)
	// The next two fit the next minute, the one after the minute after.
	assert.Equal(t, bucket.Reservation{OK: true, Delay: winToMinute}, winReserve(t, b, "k", bucket.N(1), time.Minute))
	assert.Equal(t, bucket.Reservation{OK: true, Delay: winToMinute}, winReserve(t, b, "k", bucket.N(1), winToMinute))
	assert.Equal(t, bucket.Reservation{RetryAfter: winToMinute + time.Minute}, winReserve(t, b, "k", bucket.N(1), time.Minute),
		"a window past maxWait takes nothing")
	assert.Equal(t, bucket.Reservation{OK: true, Delay: winToMinute + time.Minute}, winReserve(t, b, "k", bucket.N(2), bucket.Unlimited))

	cur, next, after := winIndex(w.now, time.Minute), winIndex(w.now.Add(time.Minute), time.Minute), winIndex(w.now.Add(2*time.Minute), time.Minute)
	keys, err := w.srv.HKeys(rk)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{cur, next, after}, keys)
	assert.Equal(t, "2", w.srv.HGet(rk, cur))
	assert.Equal(t, "2", w.srv.HGet(rk, next))
	assert.Equal(t, "2", w.srv.HGet(rk, after))
	// The TTL covers the last window counted, plus a second.
	assert.Equal(t, winToMinute.Round(time.Millisecond)+2*time.Minute+time.Second, w.srv.TTL(rk))

	// In the next minute, the past window's count goes with the next write
	// and the allowance left is that of the reservations made for it.
	w.advance(winToMinute)
	assert.Equal(t, bucket.Cost{bucket.Requests: 0}, winTokens(t, b, "k"))
	assert.Equal(t, bucket.Reservation{OK: true, Delay: 2 * time.Minute}, winReserve(t, b, "k", bucket.N(1), bucket.Unlimited))
	keys, err = w.srv.HKeys(rk)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{next, after, winIndex(w.now.Add(2*time.Minute), time.Minute)}, keys)
}

func TestFixedWindowTwoDimensionsAllOrNothing(t *testing.T) {
	w := newWinRedis(t)
	// Requests by the minute, tokens by windows of 10 s: 1000 / 100 per s.
	b := bucket.NewFixedWindow(w.rdb, bucket.PerMinute(10), bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 100, Burst: 1000}))
	cost := bucket.Cost{bucket.Requests: 1, bucket.Tokens: 600}
	assert.True(t, winReserve(t, b, "k", cost, 0).OK)
	// Tokens are short until their 10 s window ends; requests are not.
	toTen := 9*time.Second + 876543*time.Microsecond
	assert.Equal(t, bucket.Reservation{RetryAfter: toTen}, winReserve(t, b, "k", cost, 0))
	assert.Equal(t, bucket.Cost{bucket.Requests: 9, bucket.Tokens: 400}, winTokens(t, b, "k"),
		"a cost the second dimension refuses takes nothing from the first")
	tk, err := w.srv.HKeys("sluice:{k}:requests:window")
	require.NoError(t, err)
	assert.Len(t, tk, 1)

	// Reserved for the next tokens window; requests count it in this minute.
	assert.Equal(t, bucket.Reservation{OK: true, Delay: toTen}, winReserve(t, b, "k", cost, time.Minute))
	assert.Equal(t, bucket.Cost{bucket.Requests: 8, bucket.Tokens: 400}, winTokens(t, b, "k"))
	assert.Equal(t, "600", w.srv.HGet("sluice:{k}:tokens:window", winIndex(w.now.Add(toTen), 10*time.Second)))

	// Fill this minute's requests: now each dimension is full in a different
	// window, and the first moment both have room is the next minute.
	assert.True(t, winReserve(t, b, "k", bucket.N(8), 0).OK)
	assert.Equal(t, bucket.Reservation{OK: true, Delay: winToMinute}, winReserve(t, b, "k", bucket.Cost{bucket.Requests: 1, bucket.Tokens: 500}, time.Minute))
	assert.Equal(t, "500", w.srv.HGet("sluice:{k}:tokens:window", winIndex(w.now.Add(winToMinute), 10*time.Second)))
	assert.Equal(t, "1", w.srv.HGet("sluice:{k}:requests:window", winIndex(w.now.Add(winToMinute), time.Minute)))
}

func TestFixedWindowAdjust(t *testing.T) {
	w := newWinRedis(t)
	b := bucket.NewFixedWindow(w.rdb, bucket.PerMinute(5))
	rk := "sluice:{k}:requests:window"
	assert.True(t, winReserve(t, b, "k", bucket.N(5), 0).OK)
	require.NoError(t, b.Adjust(t.Context(), "k", bucket.N(-2)))
	assert.Equal(t, bucket.Cost{bucket.Requests: 2}, winTokens(t, b, "k"))

	// A refund frees the latest window first: the slot of a cancelled wait.
	assert.True(t, winReserve(t, b, "k", bucket.N(2), 0).OK)
	r := winReserve(t, b, "k", bucket.N(3), time.Minute)
	require.Equal(t, bucket.Reservation{OK: true, Delay: winToMinute}, r)
	require.NoError(t, b.Adjust(t.Context(), "k", bucket.N(-3)))
	keys, err := w.srv.HKeys(rk)
	require.NoError(t, err)
	assert.Equal(t, []string{winIndex(w.now, time.Minute)}, keys)
	assert.Equal(t, "5", w.srv.HGet(rk, keys[0]))

	// Spread over two windows, a refund empties the later one, then takes
	// the rest from the earlier one.
	assert.True(t, winReserve(t, b, "k", bucket.N(2), time.Minute).OK)
	require.NoError(t, b.Adjust(t.Context(), "k", bucket.N(-3)))
	assert.Equal(t, []string{winIndex(w.now, time.Minute)}, winMust(w.srv.HKeys(rk)))
	assert.Equal(t, bucket.Cost{bucket.Requests: 1}, winTokens(t, b, "k"))

	// Never below zero: a refund beyond every count leaves no key at all.
	require.NoError(t, b.Adjust(t.Context(), "k", bucket.N(-100)))
	assert.False(t, w.srv.Exists(rk))
	assert.Equal(t, bucket.Cost{bucket.Requests: 5}, winTokens(t, b, "k"))

	// A debit counts in the current window, past its allowance.
	// One debit takes at most a burst.
	require.NoError(t, b.Adjust(t.Context(), "k", bucket.N(1e15)))
	require.NoError(t, b.Adjust(t.Context(), "k", bucket.N(2)))
	assert.Equal(t, bucket.Cost{bucket.Requests: -2}, winTokens(t, b, "k"))
	assert.Equal(t, bucket.Reservation{RetryAfter: winToMinute}, winReserve(t, b, "k", bucket.N(1), 0))
	assert.Equal(t, winToMinute.Round(time.Millisecond)+time.Second, w.srv.TTL(rk))
	// ... and does not spill into the next one.
	w.advance(winToMinute)
	assert.Equal(t, bucket.Cost{bucket.Requests: 5}, winTokens(t, b, "k"))

	assert.ErrorIs(t, b.Adjust(t.Context(), "k", bucket.N(math.Inf(-1))), bucket.ErrInvalidCost)
}

// TestFixedWindowCancelledWaitRefunds: WaitMax gives back the future slot
// when its context ends during the wait.
func TestFixedWindowCancelledWaitRefunds(t *testing.T) {
	w := newWinRedis(t)
	b := bucket.NewFixedWindow(w.rdb, bucket.PerMinute(5))
	assert.True(t, winReserve(t, b, "k", bucket.N(5), 0).OK)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	time.AfterFunc(20*time.Millisecond, cancel) // the Delay is ~20 s of the server's time
	r, err := bucket.WaitMax(ctx, b, "k", bucket.N(4), time.Minute)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, winToMinute, r.Delay)
	keys, err := w.srv.HKeys("sluice:{k}:requests:window")
	require.NoError(t, err)
	assert.Equal(t, []string{winIndex(w.now, time.Minute)}, keys, "the next window's slot was given back")
}

func TestFixedWindowKeysTTLAndPrecision(t *testing.T) {
	w := newWinRedis(t)
	b := bucket.NewFixedWindow(w.rdb, bucket.Limit{Rate: 2, Burst: 20}, // 10 s windows
		bucket.WithLimit(bucket.Tokens, bucket.PerMinute(1000)), bucket.WithPrefix("app"),
		bucket.WithFailClosed()) // no membership set (TestFleetMembers): the bucket's own keys only
	assert.True(t, winReserve(t, b, "k", bucket.Cost{bucket.Requests: 1, bucket.Tokens: 10}, 0).OK)
	assert.ElementsMatch(t, []string{"app:{k}:requests:window", "app:{k}:tokens:window"}, w.srv.Keys(),
		"every dimension of a key in one hash slot")
	// The window number is floor(µs / window), exact at today's epoch.
	assert.Equal(t, []string{"179500000"}, winMust(w.srv.HKeys("app:{k}:requests:window")))
	assert.Equal(t, []string{"29916666"}, winMust(w.srv.HKeys("app:{k}:tokens:window")))
	// Each key lives until its window ends, plus a second.
	assert.Equal(t, 10877*time.Millisecond, w.srv.TTL("app:{k}:requests:window"))
	assert.Equal(t, 20877*time.Millisecond, w.srv.TTL("app:{k}:tokens:window"))

	// At the last microsecond of a window, and at the first of the next.
	w.advance(9*time.Second + 876542*time.Microsecond)
	assert.True(t, winReserve(t, b, "k", bucket.N(1), 0).OK)
	assert.Equal(t, "2", w.srv.HGet("app:{k}:requests:window", "179500000"))
	assert.Equal(t, 1001*time.Millisecond, w.srv.TTL("app:{k}:requests:window"), "1 µs, rounded up to 1 ms, plus a second")
	w.advance(time.Microsecond)
	assert.True(t, winReserve(t, b, "k", bucket.N(1), 0).OK)
	assert.Equal(t, []string{"179500001"}, winMust(w.srv.HKeys("app:{k}:requests:window")))
	assert.Equal(t, 11*time.Second, w.srv.TTL("app:{k}:requests:window"))

	// Idle keys disappear once their windows are over, plus a second. The
	// 10 s window and the minute both end at :20, so both keys are due at
	// :21 to the millisecond (miniredis, which kept TTLs from a now not cut
	// to the millisecond, had the tokens key 0.457 ms longer), and Redis
	// deletes a key a millisecond past due.
	w.advance(11 * time.Second)
	assert.Equal(t, []string{"app:{k}:requests:window", "app:{k}:tokens:window"}, w.srv.Keys(), "due")
	assert.Zero(t, w.srv.TTL("app:{k}:requests:window"))
	assert.Zero(t, w.srv.TTL("app:{k}:tokens:window"))
	w.advance(time.Millisecond)
	assert.Empty(t, w.srv.Keys())
}

// TestFixedWindowAndSlidingLogRejectImpossibleCosts: a cost that can never
// be admitted fails at once with a *CostError, without calling Redis (the
// client points at a closed port).
func TestFixedWindowAndSlidingLogRejectImpossibleCosts(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	opts := bucket.WithLimit(bucket.Tokens, bucket.PerMinute(100))
	for name, b := range map[string]bucket.Bucket{
		"fixed window": bucket.NewFixedWindow(rdb, bucket.PerMinute(5), opts, bucket.WithFailClosed()),
		"sliding log":  bucket.NewSlidingLog(rdb, bucket.PerMinute(5), opts, bucket.WithFailClosed()),
	} {
		t.Run(name, func(t *testing.T) {
			for _, tc := range []struct {
				name string
				cost bucket.Cost
				want error
			}{
				{"above burst", bucket.N(6), bucket.ErrExceedsBurst},
				{"second dimension above burst", bucket.Cost{bucket.Requests: 1, bucket.Tokens: 101}, bucket.ErrExceedsBurst},
				{"negative", bucket.N(-1), bucket.ErrInvalidCost},
				{"NaN", bucket.N(math.NaN()), bucket.ErrInvalidCost},
				{"infinite", bucket.Cost{bucket.Tokens: math.Inf(1)}, bucket.ErrInvalidCost},
			} {
				t.Run(tc.name, func(t *testing.T) {
					r, err := b.Reserve(t.Context(), "k", tc.cost, bucket.Unlimited)
					assert.ErrorIs(t, err, tc.want)
					var ce *bucket.CostError
					assert.True(t, errors.As(err, &ce), "%v", err)
					assert.Equal(t, bucket.Reservation{}, r)
				})
			}
			assert.ErrorIs(t, b.Adjust(t.Context(), "k", bucket.N(math.NaN())), bucket.ErrInvalidCost)
			// Nothing to charge: no call either.
			r, err := b.Reserve(t.Context(), "k", bucket.Cost{bucket.Requests: 0, "images": 3}, 0)
			require.NoError(t, err)
			assert.Equal(t, bucket.Reservation{OK: true}, r)
			// A valid cost does reach Redis, and its failure is an error.
			_, err = b.Reserve(t.Context(), "k", bucket.N(1), 0)
			assert.ErrorContains(t, err, "bucket: redis reserve")
			assert.ErrorContains(t, b.Adjust(t.Context(), "k", bucket.N(1)), "bucket: redis adjust")
		})
	}
}

// TestFixedWindowSlidingLogTokenBucketCompared documents how the three
// algorithms read the same Limit, PerMinute(10), on the same clock:
//   - across a minute boundary, the fixed window admits 2·B within seconds
//     (B at :50, B at :00); the token bucket admits B plus what refilled; the
//     sliding log admits nothing more until the first admissions are a
//     minute old.
//   - within one aligned minute, the token bucket admits up to 2·B (a full
//     bucket, then its refill); the other two admit B.
func TestFixedWindowSlidingLogTokenBucketCompared(t *testing.T) {
	drain := func(b bucket.Bucket, key string) int {
		n := 0
		for winReserve(t, b, key, bucket.N(1), 0).OK {
			n++
		}
		return n
	}
	w := newWinRedis(t)
	minute := winStart.Truncate(time.Minute)
	w.advance(minute.Add(50 * time.Second).Sub(w.now))
	l := bucket.PerMinute(10)
	algos := []struct {
		name string
		b    bucket.Bucket
	}{
		{"token bucket", bucket.NewRedis(w.rdb, l)},
		{"fixed window", bucket.NewFixedWindow(w.rdb, l)},
		{"sliding log", bucket.NewSlidingLog(w.rdb, l)},
	}
	got := map[string][]int{}
	for _, a := range algos {
		got[a.name] = append(got[a.name], drain(a.b, "boundary"))
	}
	w.advance(10 * time.Second) // :00 of the next minute
	for _, a := range algos {
		got[a.name] = append(got[a.name], drain(a.b, "boundary"))
	}
	assert.Equal(t, []int{10, 10}, got["fixed window"], "2·B in 10 s across the boundary")
	assert.Equal(t, []int{10, 1}, got["token bucket"], "B, then 10 s of refill at 1/6 per s")
	assert.Equal(t, []int{10, 0}, got["sliding log"], "never more than B in a minute")

	// One aligned minute, from :00, with calls every 6 s (and 1 µs, so that
	// the token bucket's float refill surely reaches a whole token).
	got = map[string][]int{}
	for i := range 10 {
		for _, a := range algos {
			got[a.name] = append(got[a.name], drain(a.b, "aligned"))
		}
		if i < 9 {
			w.advance(6*time.Second + time.Microsecond)
		}
	}
	sum := func(xs []int) (s int) {
		for _, x := range xs {
			s += x
		}
		return s
	}
	assert.Equal(t, 19, sum(got["token bucket"]), "%v: B at :00, then one refilled token every 6 s", got["token bucket"])
	assert.Equal(t, 10, sum(got["fixed window"]), "%v", got["fixed window"])
	assert.Equal(t, 10, sum(got["sliding log"]), "%v", got["sliding log"])
}

// TestFixedWindowConcurrentRealRedis: 16 goroutines for about a second on a
// real Redis, with waits. Polled server-side counts never exceed the
// allowance, nor do admissions timed by the server's TIME around each call.
func TestFixedWindowConcurrentRealRedis(t *testing.T) {
	rdb := redistest.Client(t)
	const burst, window = 20, 100 * time.Millisecond
	b := bucket.NewFixedWindow(rdb, bucket.Limit{Rate: burst / window.Seconds(), Burst: burst})
	key := "fw-concurrent-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	rk := "sluice:{" + key + "}:requests:window"
	ctx := t.Context()

	type admission struct {
		lo, hi int64 // server TIME before and after Reserve, µs
		delay  int64
	}
	var (
		mu       sync.Mutex
		admitted []admission
		wg       sync.WaitGroup
		stop     = time.Now().Add(time.Second)
	)
	for g := range 16 {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(g), 1))
			for time.Now().Before(stop) {
				lo, err := rdb.Time(ctx).Result()
				if !assert.NoError(t, err) {
					return
				}
				r, err := b.Reserve(ctx, key, bucket.N(1), time.Duration(rnd.Int64N(int64(2*window))))
				if !assert.NoError(t, err) {
					return
				}
				hi, err := rdb.Time(ctx).Result()
				if !assert.NoError(t, err) {
					return
				}
				if r.OK {
					mu.Lock()
					admitted = append(admitted, admission{lo.UnixMicro(), hi.UnixMicro(), r.Delay.Microseconds()})
					mu.Unlock()
					time.Sleep(r.Delay) // the slot's owner waits for it
				} else {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	// Poll the counts meanwhile: they only grow, and never past the burst.
	seen := map[string]float64{}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for polling := true; polling; {
		select {
		case <-done:
			polling = false
		case <-time.After(5 * time.Millisecond):
		}
		h, err := rdb.HGetAll(ctx, rk).Result()
		require.NoError(t, err)
		for f, v := range h {
			_, err := strconv.ParseInt(f, 10, 64)
			require.NoError(t, err, "window numbers are integers")
			n, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			assert.LessOrEqual(t, n, float64(burst), "window %s", f)
			assert.GreaterOrEqual(t, n, seen[f], "window %s", f)
			seen[f] = n
		}
	}

	// Place each admission in its window by server time, when the brackets
	// say which: a wait ends exactly at a window's start.
	w := window.Microseconds()
	per := map[int64]int{}
	placed := 0
	for _, a := range admitted {
		lo, hi := a.lo+a.delay, a.hi+a.delay
		var idx int64
		switch {
		case a.delay == 0 && lo/w == hi/w:
			idx = lo / w
		case a.delay > 0 && (lo+w-1)/w == hi/w:
			idx = hi / w
		default:
			continue
		}
		per[idx]++
		placed++
	}
	for idx, n := range per {
		assert.LessOrEqual(t, n, burst, "window %d", idx)
	}
	t.Logf("admitted %d in %d windows, %d placed by server time", len(admitted), len(per), placed)
	assert.GreaterOrEqual(t, placed, len(admitted)/2, "most admissions are placed unambiguously")
	// Saturated: about burst per window over ~10 windows; be generous.
	assert.GreaterOrEqual(t, len(admitted), 5*burst)
}

func winMust[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
