package bucket_test

import (
	"context"
	"math/rand/v2"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// logScores returns the scores of a sliding log's entries, in order, as
// integer microseconds.
func logScores(t *testing.T, w *winRedis, key string) []int64 {
	t.Helper()
	set, err := w.srv.SortedSet(key)
	require.NoError(t, err)
	var s []int64
	for _, f := range set {
		require.Equal(t, float64(int64(f)), f, "scores are whole microseconds")
		s = append(s, int64(f))
	}
	slices.Sort(s)
	return s
}

func TestSlidingLogAllowanceAndRetryAfter(t *testing.T) {
	w := newWinRedis(t)
	b := bucket.NewSlidingLog(w.rdb, bucket.Limit{Rate: 0.5, Burst: 5}) // 5 per 10 s
	t0 := w.now
	assert.Equal(t, bucket.Reservation{OK: true}, winReserve(t, b, "k", bucket.N(2), 0))
	w.advance(time.Second)
	assert.Equal(t, bucket.Reservation{OK: true}, winReserve(t, b, "k", bucket.N(2), 0))
	w.advance(time.Second)
	assert.Equal(t, bucket.Reservation{OK: true}, winReserve(t, b, "k", bucket.N(1), 0))
	assert.Equal(t, bucket.Cost{bucket.Requests: 0}, winTokens(t, b, "k"))
	w.advance(time.Second)
	// One more fits once the first entry is 10 s old; three more once the
	// second one is too.
	assert.Equal(t, bucket.Reservation{RetryAfter: 7 * time.Second}, winReserve(t, b, "k", bucket.N(1), 0))
	assert.Equal(t, bucket.Reservation{RetryAfter: 8 * time.Second}, winReserve(t, b, "k", bucket.N(3), 0))
	w.advance(7*time.Second - time.Microsecond)
	assert.Equal(t, bucket.Reservation{RetryAfter: time.Microsecond}, winReserve(t, b, "k", bucket.N(1), 0))
	w.advance(time.Microsecond)
	assert.Equal(t, bucket.Reservation{OK: true}, winReserve(t, b, "k", bucket.N(1), 0))
	assert.Equal(t, bucket.Cost{bucket.Requests: 1}, winTokens(t, b, "k"))
	assert.Equal(t, []int64{
		t0.Add(time.Second).UnixMicro(), t0.Add(2 * time.Second).UnixMicro(), t0.Add(10 * time.Second).UnixMicro(),
	}, logScores(t, w, "sluice:{k}:requests:log"), "entries 10 s old are gone")
	// A cost that charges no limited dimension is free.
	assert.Equal(t, bucket.Reservation{OK: true}, winReserve(t, b, "k", bucket.Cost{"images": 1e9}, 0))
}

func TestSlidingLogFutureReservationsAndPrecision(t *testing.T) {
	w := newWinRedis(t)
	b := bucket.NewSlidingLog(w.rdb, bucket.PerMinute(3))
	rk := "sluice:{k}:requests:log"
	t0 := w.now.UnixMicro()
	for range 3 {
		assert.True(t, winReserve(t, b, "k", bucket.N(1), 0).OK)
	}
	w.advance(time.Second + time.Microsecond)
	// The three entries of t0 stop counting at t0 + 60 s: three fit then,
	// and the next ones a minute later.
	for i := range 3 {
		assert.Equal(t, bucket.Reservation{OK: true, Delay: 58*time.Second + 999999*time.Microsecond},
			winReserve(t, b, "k", bucket.N(1), time.Minute), "waiter %d", i)
	}
	assert.Equal(t, bucket.Reservation{RetryAfter: 118*time.Second + 999999*time.Microsecond},
		winReserve(t, b, "k", bucket.N(1), time.Minute), "past maxWait: nothing taken")
	assert.Equal(t, bucket.Reservation{OK: true, Delay: 118*time.Second + 999999*time.Microsecond},
		winReserve(t, b, "k", bucket.N(1), bucket.Unlimited))
	assert.Equal(t, bucket.Cost{bucket.Requests: -4}, winTokens(t, b, "k"))

	// Scores keep every microsecond of today's epoch.
	m := int64(time.Minute / time.Microsecond)
	assert.Equal(t, []int64{t0, t0, t0, t0 + m, t0 + m, t0 + m, t0 + 2*m}, logScores(t, w, rk))
	members, err := w.srv.ZMembers(rk)
	require.NoError(t, err)
	ids := map[string]bool{}
	for _, mb := range members {
		assert.Regexp(t, regexp.MustCompile(`^[A-Za-z0-9_-]{12}\.[0-9a-z]+:1$`), mb)
		ids[strings.TrimSuffix(mb, ":1")] = true
	}
	assert.Len(t, ids, 7, "one id per call")
	// The key lives until the last entry stops counting, plus a second.
	assert.Equal(t, 179*time.Second+time.Second, w.srv.TTL(rk))
}

func TestSlidingLogTwoDimensionsAllOrNothing(t *testing.T) {
	w := newWinRedis(t)
	// Requests by the minute, tokens by 10 s: 1000 / 100 per s.
	b := bucket.NewSlidingLog(w.rdb, bucket.PerMinute(10), bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 100, Burst: 1000}))
	t0 := w.now
	cost := bucket.Cost{bucket.Requests: 1, bucket.Tokens: 600}
	assert.True(t, winReserve(t, b, "k", cost, 0).OK)
	assert.Equal(t, bucket.Reservation{RetryAfter: 10 * time.Second}, winReserve(t, b, "k", cost, 0))
	assert.Equal(t, bucket.Cost{bucket.Requests: 9, bucket.Tokens: 400}, winTokens(t, b, "k"),
		"a cost the second dimension refuses takes nothing from the first")
	assert.Equal(t, []int64{t0.UnixMicro()}, logScores(t, w, "sluice:{k}:requests:log"))

	// Admitted at the moment the slowest dimension allows, in both.
	assert.Equal(t, bucket.Reservation{OK: true, Delay: 10 * time.Second}, winReserve(t, b, "k", cost, 10*time.Second))
	later := t0.Add(10 * time.Second).UnixMicro()
	assert.Equal(t, []int64{t0.UnixMicro(), later}, logScores(t, w, "sluice:{k}:requests:log"))
	assert.Equal(t, []int64{t0.UnixMicro(), later}, logScores(t, w, "sluice:{k}:tokens:log"))
	assert.Equal(t, bucket.Cost{bucket.Requests: 8, bucket.Tokens: -200}, winTokens(t, b, "k"))

	// A cost that leaves out a dimension does not touch it.
	assert.True(t, winReserve(t, b, "k", bucket.N(1), 0).OK)
	assert.Equal(t, bucket.Cost{bucket.Requests: 7, bucket.Tokens: -200}, winTokens(t, b, "k"))
}

func TestSlidingLogAdjust(t *testing.T) {
	w := newWinRedis(t)
	b := bucket.NewSlidingLog(w.rdb, bucket.PerMinute(5))
	rk := "sluice:{k}:requests:log"
	t0 := w.now
	for i := range 3 {
		if i > 0 {
			w.advance(time.Second)
		}
		assert.True(t, winReserve(t, b, "k", bucket.N(1), 0).OK)
	}
	// A refund removes the newest entries.
	require.NoError(t, b.Adjust(t.Context(), "k", bucket.N(-2)))
	assert.Equal(t, []int64{t0.UnixMicro()}, logScores(t, w, rk))
	assert.Equal(t, bucket.Cost{bucket.Requests: 4}, winTokens(t, b, "k"))

	// ... shrinking the last one it reaches, which keeps its id and moment.
	assert.True(t, winReserve(t, b, "k", bucket.N(3), 0).OK)
	before, err := w.srv.ZMembers(rk)
	require.NoError(t, err)
	require.NoError(t, b.Adjust(t.Context(), "k", bucket.N(-1)))
	after, err := w.srv.ZMembers(rk)
	require.NoError(t, err)
	require.Len(t, after, 2)
	for i := range before {
		if strings.HasSuffix(before[i], ":3") {
			assert.Contains(t, after, strings.TrimSuffix(before[i], ":3")+":2")
		}
	}
	assert.Equal(t, []int64{t0.UnixMicro(), w.now.UnixMicro()}, logScores(t, w, rk))
	assert.Equal(t, bucket.Cost{bucket.Requests: 2}, winTokens(t, b, "k"))

	// A refund frees the slot of a cancelled wait first: the newest entry.
	assert.True(t, winReserve(t, b, "k", bucket.N(2), 0).OK)
	r := winReserve(t, b, "k", bucket.N(1), time.Minute)
	require.Equal(t, bucket.Reservation{OK: true, Delay: 58 * time.Second}, r)
	require.NoError(t, b.Adjust(t.Context(), "k", bucket.N(-1)))
	assert.Equal(t, []int64{t0.UnixMicro(), w.now.UnixMicro(), w.now.UnixMicro()}, logScores(t, w, rk))
	assert.Equal(t, bucket.Cost{bucket.Requests: 0}, winTokens(t, b, "k"))

	// A refund beyond every entry leaves no key at all.
	require.NoError(t, b.Adjust(t.Context(), "k", bucket.N(-100)))
	assert.False(t, w.srv.Exists(rk))
	assert.Equal(t, bucket.Cost{bucket.Requests: 5}, winTokens(t, b, "k"))

	// A debit is logged now, past the burst: nothing fits until it is a
	// window old.
	// One debit takes at most a burst.
	require.NoError(t, b.Adjust(t.Context(), "k", bucket.N(1e15)))
	require.NoError(t, b.Adjust(t.Context(), "k", bucket.N(2)))
	assert.Equal(t, bucket.Cost{bucket.Requests: -2}, winTokens(t, b, "k"))
	assert.Equal(t, bucket.Reservation{RetryAfter: time.Minute}, winReserve(t, b, "k", bucket.N(1), 0))
	assert.Equal(t, time.Minute+time.Second, w.srv.TTL(rk))
	assert.Equal(t, bucket.Reservation{OK: true, Delay: time.Minute}, winReserve(t, b, "k", bucket.N(5), time.Minute))
}

// TestSlidingLogCancelledWaitRefunds: WaitMax gives back the future slot
// when its context ends during the wait.
func TestSlidingLogCancelledWaitRefunds(t *testing.T) {
	w := newWinRedis(t)
	b := bucket.NewSlidingLog(w.rdb, bucket.PerMinute(5))
	assert.True(t, winReserve(t, b, "k", bucket.N(5), 0).OK)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	time.AfterFunc(20*time.Millisecond, cancel) // the Delay is a minute of the server's time
	r, err := bucket.WaitMax(ctx, b, "k", bucket.N(4), 2*time.Minute)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, time.Minute, r.Delay)
	assert.Equal(t, []int64{w.now.UnixMicro()}, logScores(t, w, "sluice:{k}:requests:log"), "the future slot was given back")
}

func TestSlidingLogKeysAndTTL(t *testing.T) {
	w := newWinRedis(t)
	b := bucket.NewSlidingLog(w.rdb, bucket.Limit{Rate: 0.5, Burst: 5}, // 10 s window
		bucket.WithLimit(bucket.Tokens, bucket.PerMinute(1000)), bucket.WithPrefix("app"),
		bucket.WithFailClosed()) // no membership set (TestFleetMembers): the bucket's own keys only
	assert.True(t, winReserve(t, b, "k", bucket.Cost{bucket.Requests: 5, bucket.Tokens: 10}, 0).OK)
	assert.ElementsMatch(t, []string{"app:{k}:requests:log", "app:{k}:tokens:log"}, w.srv.Keys(),
		"every dimension of a key in one hash slot")
	assert.Equal(t, 11*time.Second, w.srv.TTL("app:{k}:requests:log"))
	assert.Equal(t, 61*time.Second, w.srv.TTL("app:{k}:tokens:log"))
	// A future entry lengthens the TTL to cover it.
	assert.Equal(t, bucket.Reservation{OK: true, Delay: 10 * time.Second}, winReserve(t, b, "k", bucket.N(1), 10*time.Second))
	assert.Equal(t, 21*time.Second, w.srv.TTL("app:{k}:requests:log"))

	// Idle keys disappear once their entries stop counting.
	w.advance(21*time.Second - time.Millisecond)
	assert.True(t, w.srv.Exists("app:{k}:requests:log"))
	w.advance(time.Millisecond)
	assert.True(t, w.srv.Exists("app:{k}:requests:log"), "due: Redis deletes a key a millisecond past due")
	w.advance(time.Millisecond)
	assert.Equal(t, []string{"app:{k}:tokens:log"}, w.srv.Keys())
	w.advance(40 * time.Second)
	assert.Empty(t, w.srv.Keys())
}

// logEntry is one admission: its moment and amounts.
type logEntry struct {
	at   int64 // µs
	cost bucket.Cost
}

// maxInWindow returns the largest sum of dim's amounts over entries in any
// interval [x, x+window) of microseconds.
func maxInWindow(entries []logEntry, dim string, window int64) float64 {
	sorted := slices.Clone(entries)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].at < sorted[j].at })
	best, sum, lo := 0.0, 0.0, 0
	for _, e := range sorted {
		sum += e.cost[dim]
		for sorted[lo].at <= e.at-window {
			sum -= sorted[lo].cost[dim]
			lo++
		}
		best = max(best, sum)
	}
	return best
}

// TestSlidingLogNeverExceedsBurstInAnyWindow: random arrivals, costs and
// waits over two dimensions of different windows, under controlled time.
// Over all admissions, every window of either dimension holds at most its
// burst; the server's log agrees with the moments Reserve reported; and
// RetryAfter is exactly the wait at which the same cost would be admitted.
func TestSlidingLogNeverExceedsBurstInAnyWindow(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			w := newWinRedis(t)
			const reqBurst, tokBurst = 5, 100
			reqWindow, tokWindow := time.Second.Microseconds(), 4*time.Second.Microseconds()
			b := bucket.NewSlidingLog(w.rdb, bucket.Limit{Rate: 5, Burst: reqBurst},
				bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 25, Burst: tokBurst}))
			rnd := rand.New(rand.NewPCG(seed, 42))
			var admitted []logEntry
			checked := 0
			for range 1500 {
				if rnd.IntN(5) > 0 {
					w.advance(time.Duration(rnd.Int64N(300_000)) * time.Microsecond)
				}
				cost := bucket.Cost{bucket.Requests: float64(1 + rnd.IntN(3))}
				if n := rnd.IntN(4); n > 0 {
					cost[bucket.Tokens] = float64(rnd.IntN(33 * n)) // at most 98
				}
				var maxWait time.Duration
				if rnd.IntN(2) == 0 {
					maxWait = time.Duration(rnd.Int64N(int64(3 * time.Second)))
				}
				r := winReserve(t, b, "k", cost, maxWait)
				if !r.OK {
					require.Greater(t, r.RetryAfter, maxWait)
					// Checked only for short waits, which keeps the queue
					// of future entries, and the log, bounded.
					if rnd.IntN(2) == 0 && r.RetryAfter <= 3*time.Second {
						checked++
						require.Equal(t, bucket.Reservation{RetryAfter: r.RetryAfter},
							winReserve(t, b, "k", cost, r.RetryAfter-time.Microsecond))
						maxWait = r.RetryAfter
						want := r.RetryAfter
						r = winReserve(t, b, "k", cost, maxWait)
						require.Equal(t, bucket.Reservation{OK: true, Delay: want}, r)
					}
				}
				if r.OK {
					require.LessOrEqual(t, r.Delay, maxWait)
					admitted = append(admitted, logEntry{w.now.Add(r.Delay).UnixMicro(), cost})
				}
			}
			req := maxInWindow(admitted, bucket.Requests, reqWindow)
			tok := maxInWindow(admitted, bucket.Tokens, tokWindow)
			t.Logf("%d admitted, %d RetryAfter checked; fullest windows: %v requests, %v tokens", len(admitted), checked, req, tok)
			assert.LessOrEqual(t, req, float64(reqBurst))
			assert.LessOrEqual(t, tok, float64(tokBurst))
			assert.Equal(t, float64(reqBurst), req, "demand filled some window")
			assert.Greater(t, checked, 10)

			// The entries still counting in the server's log are those admitted.
			now := w.now.UnixMicro()
			var want []int64
			for _, e := range admitted {
				if e.at > now-reqWindow {
					want = append(want, e.at)
				}
			}
			slices.Sort(want)
			got := logScores(t, w, "sluice:{k}:requests:log")
			// Entries a window old are removed by the next write only.
			got = slices.DeleteFunc(got, func(s int64) bool { return s <= now-reqWindow })
			assert.Equal(t, want, got)
		})
	}
}

// TestSlidingLogConcurrentRealRedis: 16 goroutines for about a second on a
// real Redis, with waits. The log, polled meanwhile, never holds more than
// the burst in any window, by the server's own timestamps.
func TestSlidingLogConcurrentRealRedis(t *testing.T) {
	rdb := redistest.Client(t)
	const burst, window = 20, 200 * time.Millisecond
	b := bucket.NewSlidingLog(rdb, bucket.Limit{Rate: burst / window.Seconds(), Burst: burst})
	key := "sl-concurrent-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	rk := "sluice:{" + key + "}:requests:log"
	ctx := t.Context()

	var (
		mu       sync.Mutex
		admitted int
		wg       sync.WaitGroup
		stop     = time.Now().Add(time.Second)
	)
	for g := range 16 {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(g), 2))
			for time.Now().Before(stop) {
				r, err := b.Reserve(ctx, key, bucket.N(1), time.Duration(rnd.Int64N(int64(window+window/2))))
				if !assert.NoError(t, err) {
					return
				}
				if r.OK {
					mu.Lock()
					admitted++
					mu.Unlock()
					time.Sleep(r.Delay) // the slot's owner waits for it
				} else {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	seen := map[string]int64{} // member → score
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for polling := true; polling; {
		select {
		case <-done:
			polling = false
		case <-time.After(5 * time.Millisecond):
		}
		zs, err := rdb.ZRangeWithScores(ctx, rk, 0, -1).Result()
		require.NoError(t, err)
		for _, z := range zs {
			require.Equal(t, float64(int64(z.Score)), z.Score, "scores are whole microseconds")
			seen[z.Member.(string)] = int64(z.Score)
		}
	}
	var entries []logEntry
	for _, s := range seen {
		entries = append(entries, logEntry{s, bucket.N(1)})
	}
	fullest := maxInWindow(entries, bucket.Requests, window.Microseconds())
	t.Logf("admitted %d, %d seen in the log, fullest window %v", admitted, len(entries), fullest)
	assert.LessOrEqual(t, fullest, float64(burst))
	assert.GreaterOrEqual(t, len(entries), admitted/2, "the log was seen")
	// Saturated: about burst per window over ~5 windows; be generous.
	assert.GreaterOrEqual(t, admitted, 3*burst)
}
