package bucket_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestDisagreeingLimits: two processes that give one key different limits
// never mix them: the lower holds for both while a process uses it, the
// other is warned, and once no process has used the lower for a hold (its
// refill time, 10 s here) the higher takes over. Before, each refilled the
// shared state at its own rate: a fleet half at 1/s and half at 2/s took
// 1.5/s, silently.
func TestDisagreeingLimits(t *testing.T) {
	cr := newClockedRedis(t, epoch)
	ctx := context.Background()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	low := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 1, Burst: 10}, bucket.WithLogger(log))
	high := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 2, Burst: 20}, bucket.WithLogger(log))
	take := func(b bucket.Bucket, key string, n int) int {
		got := 0
		for range n {
			if r, err := b.Reserve(ctx, key, bucket.N(1), 0); err == nil && r.OK {
				got++
			}
		}
		return got
	}

	// The lower comes first: it holds for the higher.
	assert.Equal(t, 5, take(low, "a", 5))
	assert.Equal(t, 5, take(high, "a", 30), "the burst of 10, not of 20")
	assert.Contains(t, logs.String(), "level=WARN")
	assert.Contains(t, logs.String(), "limits a key of this bucket lower than this process does")
	cr.clock.Advance(2 * time.Second)
	assert.Equal(t, 2, take(high, "a", 30), "a refill at 1/s")

	// The lower comes second: it holds at once.
	assert.Equal(t, 20, take(high, "b", 30))
	cr.clock.Advance(time.Second)
	assert.Equal(t, 1, take(low, "b", 30), "its rate")
	cr.clock.Advance(2 * time.Second)
	assert.Equal(t, 2, take(high, "b", 30), "held to 1/s")

	// Nobody uses the lower for its hold: the higher takes over.
	cr.clock.Advance(11 * time.Second)
	assert.Equal(t, 20, take(high, "b", 30))
	cr.clock.Advance(time.Second)
	assert.Equal(t, 2, take(high, "b", 30), "its own rate again")

	// Rate and burst are held apart: the lowest of each, for as long as a
	// process has it.
	slow := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 1, Burst: 40})
	narrow := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 4, Burst: 8})
	assert.Equal(t, 8, take(slow, "c", 8))
	assert.Equal(t, 8, take(narrow, "c", 10), "the 32 left, cut to the lower burst")
	cr.clock.Advance(4 * time.Second)
	assert.Equal(t, 4, take(slow, "c", 50)+take(narrow, "c", 50), "a refill at 1/s")
	cr.clock.Advance(20 * time.Second) // narrow's hold (2 s) is long past; slow's (40 s) is not
	assert.Equal(t, 20, take(slow, "c", 50), "its own burst, at 1/s")
}

// Agreeing processes write the pins once a half hold at most.
func TestAgreeingLimits(t *testing.T) {
	cr := newClockedRedis(t, epoch)
	a := bucket.NewRedis(cr.rdb, bucket.PerSecond(100))
	b := bucket.NewRedis(cr.rdb, bucket.PerSecond(100))
	for range 10 {
		_, err := a.Reserve(context.Background(), "k", bucket.N(1), 0)
		require.NoError(t, err)
		_, err = b.Reserve(context.Background(), "k", bucket.N(1), 0)
		require.NoError(t, err)
	}
	tokens, err := b.Tokens(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 80.0, tokens[bucket.Requests])
	fields, err := cr.HKeys("sluice:{k}:requests")
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"t", "ts", "x", "i", "cr", "crx", "cb", "cbx"}, fields) // i: when the hash was made
	assert.Equal(t, cr.HGet("sluice:{k}:requests", "crx"), cr.HGet("sluice:{k}:requests", "cbx"))
	assert.Equal(t, "1796040001123456", cr.HGet("sluice:{k}:requests", "crx"), "written by the first call only")
}

// A refund that fills the key again must not drop the lower limit's pin:
// adjust deleted a full hash, pin and all, and the next process with a
// higher limit found the key full at its own burst.
func TestPinSurvivesRefundToFull(t *testing.T) {
	cr := newClockedRedis(t, epoch)
	ctx := context.Background()
	low := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 1, Burst: 10})
	high := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 10, Burst: 100})
	r, err := low.Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	require.True(t, r.OK)
	require.NoError(t, low.Adjust(ctx, "k", bucket.N(-1)), "a cancelled call's refund")
	r, err = high.Reserve(ctx, "k", bucket.N(100), 0)
	require.NoError(t, err)
	assert.False(t, r.OK, "the low process used the key within its hold: a burst of 10 holds for all")
	got := 0
	for range 100 {
		if r, err := high.Reserve(ctx, "k", bucket.N(1), 0); err == nil && r.OK {
			got++
		}
	}
	assert.Equal(t, 10, got)
}

// TestRefusedReservationWritesNoPin: a process that is only refused takes
// nothing, and its limit holds nobody: the fleet keeps its own. Before, a
// refusal wrote its pin, and one Reserve of a process configured 1e-6/s
// held a fleet at 50/s to it for a hold (and its waiters for weeks: see
// TestAbsurdLimitDoesNotStallTheFleet).
func TestRefusedReservationWritesNoPin(t *testing.T) {
	cr := newClockedRedis(t, epoch)
	ctx := context.Background()
	low := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 1, Burst: 10})
	high := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 10, Burst: 100})
	take := func(b bucket.Bucket, n int) int {
		got := 0
		for range n {
			if r, err := b.Reserve(ctx, "k", bucket.N(1), 0); err == nil && r.OK {
				got++
			}
		}
		return got
	}
	require.Equal(t, 100, take(high, 200))
	assert.Equal(t, 0, take(low, 1), "the key is empty")
	assert.Equal(t, "10000000", cr.HGet("sluice:{k}:requests", "cr"), "the high process's pin, not the refused one's")
	highGot := 0
	for range 10 {
		cr.clock.Advance(time.Second)
		highGot += take(high, 20)
		take(low, 1)
	}
	assert.Equal(t, 100, highGot, "10/s for 10 s: the refused process holds nobody")
}

// pinFleet is four processes of a fleet at 50/s, each with callers
// goroutines waiting on key with no deadline (the transport's default), in
// a loop, until ctx ends: it counts what they are admitted.
func pinFleet(t *testing.T, ctx context.Context, key string, callers int, log *slog.Logger) *atomic.Int64 {
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		b := bucket.NewRedis(redistest.Client(t), bucket.PerSecond(50), bucket.WithFailClosed(), bucket.WithLogger(log))
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					if _, err := bucket.Wait(ctx, b, key, bucket.N(1)); err == nil {
						admitted.Add(1)
					}
				}
			}()
		}
	}
	t.Cleanup(wg.Wait)
	return &admitted
}

// rateOver returns what admitted counts per second over d from now.
func rateOver(admitted *atomic.Int64, d time.Duration) float64 {
	a0, t0 := admitted.Load(), time.Now()
	time.Sleep(d)
	return float64(admitted.Load()-a0) / time.Since(t0).Seconds()
}

// TestAbsurdLimitDoesNotStallTheFleet: the case. A fleet at 50/s
// (four processes of one caller) waits with no deadline; one process configured Limit{Rate: 1e-6,
// Burst: 1} makes a Reserve (refused) and a Wait (admitted, its slot
// 11 days off). Before, the refusal pinned the fleet's rate at 1e-6/s for
// the hold (60 s): every reservation meanwhile got a slot about 1,920 h
// off, 0 calls were admitted in the 7 s after the hold, 4 of 4 waits
// still slept at 68 s. Now the refusal writes no pin, and a pin more than
// 1000 times below a process's limit is a configuration error that holds
// nobody and is logged at error level: the fleet stays at its 50/s.
func TestAbsurdLimitDoesNotStallTheFleet(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := uniqueKey(t)
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	admitted := pinFleet(t, ctx, key, 1, log)
	time.Sleep(1500 * time.Millisecond) // the burst is spent: the fleet queues
	before := rateOver(admitted, 2*time.Second)

	absurd := bucket.NewRedis(redistest.Client(t), bucket.Limit{Rate: 1e-6, Burst: 1}, bucket.WithFailClosed(), bucket.WithLogger(log))
	refused := false
	for range 100 { // the fleet keeps the key empty, unless the machine stalls it
		r, err := absurd.Reserve(ctx, key, bucket.N(1), 0)
		require.NoError(t, err)
		if refused = !r.OK; refused {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	require.True(t, refused, "the key is empty")
	after := rateOver(admitted, 3*time.Second)
	t.Logf("fleet at 50/s: %.1f/s before, %.1f/s in the 3 s after a refused Reserve at 1e-6/s", before, after)
	assert.GreaterOrEqual(t, after, 0.8*50) // a loaded machine slows the fleet itself a little

	wctx, wcancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := bucket.Wait(wctx, absurd, key, bucket.N(1))
		waited <- err
	}()
	time.Sleep(200 * time.Millisecond) // its reservation is made
	after = rateOver(admitted, 3*time.Second)
	t.Logf("%.1f/s in the 3 s after a Wait at 1e-6/s was admitted", after)
	assert.GreaterOrEqual(t, after, 0.8*50) // a loaded machine slows the fleet itself a little
	wcancel()
	assert.ErrorIs(t, <-waited, context.Canceled, "its slot is days off")
	cancel()
	assert.Contains(t, logs.String(), "level=ERROR")
	assert.Contains(t, logs.String(), "more than 1000 times lower or higher")
}

// TestPinnedWaitersReadTheirSlotsWhenThePinLapses: a lower limit that is
// no configuration error holds the fleet while a process uses it, and no
// longer. A fleet at 50/s (four processes of one caller) waits with no
// deadline; a process configured
// Limit{Rate: 0.1, Burst: 0.1} (500 times lower: its hold, the refill
// time, is 1 s) takes 0.1 once. The fleet's four waits then get slots
// reckoned at 0.1/s, 10 to 40 s off; once the pin lapses they read them
// again, and the fleet is back at 50/s within a hold. Before, nothing read
// them again until a quarter of what was left of each wait had passed:
// the last went at about 10 s, and the fleet admitted 2-3/s in the two
// seconds after a hold past the lapse.
func TestPinnedWaitersReadTheirSlotsWhenThePinLapses(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := uniqueKey(t)
	admitted := pinFleet(t, ctx, key, 1, slog.New(slog.DiscardHandler))
	time.Sleep(1500 * time.Millisecond) // the burst is spent: the fleet queues

	const hold = time.Second
	low := bucket.NewRedis(redistest.Client(t), bucket.Limit{Rate: 0.1, Burst: 0.1}, bucket.WithFailClosed())
	r, err := low.Reserve(ctx, key, bucket.N(0.1), time.Minute)
	require.NoError(t, err)
	require.True(t, r.OK)
	lapsed := time.Now().Add(hold)
	a0 := admitted.Load()
	time.Sleep(time.Until(lapsed))
	a1 := admitted.Load()
	time.Sleep(time.Until(lapsed.Add(hold)))
	a2 := admitted.Load()
	after := rateOver(admitted, 2*time.Second)
	t.Logf("fleet at 50/s held to 0.1/s for a hold of %v: %d admitted in the hold, %d in the hold after it, %.1f/s in the 2 s after that",
		hold, a1-a0, a2-a1, after)
	assert.LessOrEqual(t, a1-a0, int64(4+1), "held: the slots reserved before the pin, and one at 0.1/s")
	assert.GreaterOrEqual(t, float64(a2-a1), 0.8*50*hold.Seconds(), "back at 50/s within a hold of the lapse")
	assert.GreaterOrEqual(t, after, 0.8*50) // a loaded machine slows the fleet itself a little
}
