package bucket_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

const tokenDay = "tokens/24h0m0s"

// spendUntilRefused reserves cost from key on each of bs in turn, maxWait
// 0, until every one is refused; it returns the tokens admitted.
func spendUntilRefused(t *testing.T, bs []*bucket.Redis, key string, cost bucket.Cost) float64 {
	t.Helper()
	admitted := 0.0
	for range 1000 {
		some := false
		for _, b := range bs {
			r, err := b.Reserve(context.Background(), key, cost, 0)
			require.NoError(t, err)
			if r.OK {
				admitted += cost[bucket.Tokens]
				some = true
			}
		}
		if !some {
			return admitted
		}
	}
	t.Fatal("never refused")
	return admitted
}

// TestWindowRecordFollowsDebits: what a process records of a window
// follows its Adjusts and Settles too, not only its reservations: a debit
// (a call that used more than its estimate, the common case for an LLM's
// output tokens reconciled WithUsage) is in the record, so a window Redis
// lost is lowered to what the fleet left of it.
//
// 3 processes, a daily window of 9000 tokens: 30 calls reserve 100 each
// (3000) and use 300 each (debits of 200: 6000). The day is spent (0
// left). Redis is flushed. Bound: Burst + Rate*T + one share burst =
// 9000 + ~0 + 3000 = 12000. Before, the records missed the debits: 6200
// admitted after the flush.
func TestWindowRecordFollowsDebits(t *testing.T) {
	for _, debit := range []bool{false, true} { // false: 9000 reserved, no debits, the control
		t.Run(map[bool]string{false: "reserved", true: "debited"}[debit], func(t *testing.T) { windowKnowledgeAfter(t, debit) })
	}
}

func windowKnowledgeAfter(t *testing.T, debit bool) {
	srv := redistest.Own(t)
	rdb := fastClient(t, srv.Addr)
	const procs = 3
	day := bucket.PerDay(9000)
	var bs []*bucket.Redis
	for range procs {
		bs = append(bs, bucket.NewRedis(rdb, bucket.PerSecond(1000),
			bucket.WithLimit(bucket.Tokens, bucket.PerMinute(1e6)),
			bucket.WithWindow(bucket.Tokens, day), bucket.WithFailClosed()))
	}
	ctx := context.Background()
	key := uniqueKey(t)
	est := bucket.Cost{bucket.Requests: 1, bucket.Tokens: 100}
	calls := 10
	if !debit {
		calls = 30
	}
	for range calls {
		for _, b := range bs {
			r, err := b.Reserve(ctx, key, est, 0)
			require.NoError(t, err)
			require.True(t, r.OK)
		}
	}
	for range 10 {
		for _, b := range bs {
			if !debit {
				break
			}
			require.NoError(t, bucket.Settle(ctx, b, key, bucket.Cost{bucket.Tokens: 200})) // used 300 of an estimate of 100
		}
	}
	tk, err := bs[0].Tokens(ctx, key)
	require.NoError(t, err)
	require.InDelta(t, 0, tk[tokenDay], 1, "the day spent: 3000 reserved, 6000 debited")
	before := 9000.0

	require.NoError(t, rdb.FlushAll(ctx).Err()) // Redis lost the hash (a restart without persistence, a flush)
	after := spendUntilRefused(t, bs, key, est)
	bound := day.Burst + day.Burst/procs + 10 // Rate*T: a few seconds of 0.1/s
	t.Logf("%.0f tokens admitted before the flush, %.0f after; bound %.0f", before, after, bound)
	assert.LessOrEqual(t, before+after, bound)
}

// TestWindowRefundedFullIsLoweredBack: a refund (Settle < 0: a cancelled
// wait, a 429's tokens given back by the transport, an unused estimate)
// that brings a window back to its burst keeps the window's hash (a full
// window outlives its last write by two of its lengths: see store in
// redis_lua.go), so the next reservation finds the hash it had. Before,
// once the pins had lapsed (60 s without a reservation) the adjust script
// deleted the full hash, the next reservation made a new one, and the
// process took it for a hash Redis lost: it lowered the window back to what
// it saw before the refund, 1907 of PerDay(10000) where 9900 are due.
func TestWindowRefundedFullIsLoweredBack(t *testing.T) {
	for _, after := range []time.Duration{30 * time.Second, 61 * time.Second} { // 30 s: the pin holds the hash, the control
		t.Run(after.String(), func(t *testing.T) { windowRefundedFullAfter(t, after) })
	}
}

func windowRefundedFullAfter(t *testing.T, after time.Duration) {
	cr := newClockedRedis(t, epoch)
	clk := &fakeClock{t: epoch}
	b := bucket.NewRedis(cr.rdb, bucket.PerMinute(600),
		bucket.WithLimit(bucket.Tokens, bucket.PerMinute(10000)),
		bucket.WithWindow(bucket.Tokens, bucket.PerDay(10000)), bucket.WithClock(clk))
	ctx := context.Background()
	key := "refunded-full"
	r, err := b.Reserve(ctx, key, bucket.Cost{bucket.Requests: 1, bucket.Tokens: 8000}, 0)
	require.NoError(t, err)
	require.True(t, r.OK)
	cr.clock.Advance(after) // the call ran a minute (a long stream), or waited; its pins lapsed
	clk.Advance(after)
	require.NoError(t, bucket.Settle(ctx, b, key, bucket.Cost{bucket.Tokens: -8000})) // refused, or cancelled: all given back
	tk, err := b.Tokens(ctx, key)
	require.NoError(t, err)
	require.InDelta(t, 10000, tk[tokenDay], 1e-6, "the day whole again")

	r, err = b.Reserve(ctx, key, bucket.Cost{bucket.Requests: 1, bucket.Tokens: 100}, 0)
	require.NoError(t, err)
	require.True(t, r.OK)
	tk, err = b.Tokens(ctx, key)
	require.NoError(t, err)
	assert.InDelta(t, 9900, tk[tokenDay], 1, "the day (full after the refund) less this call's 100")
}

// TestWindowNewHashWithAnEarlierLife: a hash's life (i) is Redis TIME when
// it was made; a hash of any other life than the one a process saw is new
// to it, an earlier one too: a Redis that comes back empty with its clock
// behind (a failover to a replica that lags; a clock stepped back) makes
// the window anew with an earlier life. Before, a process took an earlier
// life for a stale reply and ignored it, and its record froze.
//
// 3 processes spend PerDay(90); Redis is flushed and its clock stepped
// back 1 s (or on 1 s). Bound: 90 + 30 (+ Rate*T ~ 0) = 120. Before: 180
// with the clock stepped back.
func TestWindowNewHashWithAnEarlierLife(t *testing.T) {
	for _, step := range []time.Duration{time.Second, -time.Second} { // forward: the control, which holds
		t.Run(step.String(), func(t *testing.T) { windowNewHashAfterAStep(t, step) })
	}
}

func windowNewHashAfterAStep(t *testing.T, step time.Duration) {
	cr := newClockedRedis(t, epoch)
	const procs = 3
	day := bucket.PerDay(90)
	var bs []*bucket.Redis
	for range procs {
		bs = append(bs, bucket.NewRedis(cr.rdb, bucket.PerSecond(1000), bucket.WithWindow(bucket.Requests, day)))
	}
	key := "earlier-life"
	spend := func() float64 {
		n := 0.0
		for range 200 {
			for _, b := range bs {
				r, err := b.Reserve(context.Background(), key, bucket.N(1), 0)
				require.NoError(t, err)
				if r.OK {
					n++
				}
			}
			cr.clock.Advance(time.Millisecond)
		}
		return n
	}
	before := spend()
	require.Equal(t, 90.0, before)
	cr.FlushAll()
	cr.clock.Advance(step)
	after := spend()
	t.Logf("%.0f admitted before, %.0f after; bound %.0f", before, after, day.Burst+day.Burst/procs)
	assert.LessOrEqual(t, before+after, day.Burst+day.Burst/procs+1)
}
