package bucket

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// previousAdjust is the adjust script of the version before the credit
// (f96d504), which a process not yet upgraded runs: it keeps no credit.
var previousAdjust = redis.NewScript(luaCommon + `
local f = fraction(span, law)
for i = 1, #KEYS - 1 do
  local key, amount = KEYS[i+1], tonumber(ARGV[3*i+3])
  local rate, burst, tk, at, x, learnt, pr, pb, pt, rx, pin = refill(key, tonumber(ARGV[3*i+1]), tonumber(ARGV[3*i+2]), f, 0)
  tk = math.min(burst, tk - amount)
  if pt then
    pt = math.min(pb, pt - amount)
  end
  if at > now then
    tk = math.min(tk, 0) -- paused: empty at its end, or refunds would go out at once
  end
  if tk < burst or at > now or learnt or held or pinLive then
    store(key, tk, at, x, rate, burst, pt, pr, pb, rx, pin)
  else
    redis.call('DEL', key) -- kept while pinned: it would lose the pin
  end
end
return 1
`)

// TestPreviousVersionDebitMovesNoWaiterUp: in a fleet being upgraded, a
// process of the previous version debits a key (a call that used more
// than it reserved) with an adjust script that keeps no credit, so the
// credit, which should count every debit, does not count it; a served
// refund of the same amount then moves every waiter up, though the two
// cancel out. At 10/s with a burst of 20: X empties the key and is served,
// W waits for 20 (slot 2 s), the old process debits 10, X settles a
// refund of 10. W went at about 1 s: 20 + 10 + 20 - 10 = 40 by then, where
// the bucket allows 20 + 10·1 = 30.
func TestPreviousVersionDebitMovesNoWaiterUp(t *testing.T) {
	rdb := redistest.Client(t)
	b := NewRedis(rdb, Limit{Rate: 10, Burst: 20}, WithFailClosed())
	ctx := context.Background()
	key := t.Name() + time.Now().Format("150405.000000")
	start := time.Now()
	r, err := b.Reserve(ctx, key, N(20), 0) // X, served
	require.NoError(t, err)
	require.True(t, r.OK)
	woke := make(chan time.Duration, 1)
	go func() {
		_, err := WaitMax(ctx, b, key, N(20), time.Minute)
		assert.NoError(t, err)
		woke <- time.Since(start)
	}()
	time.Sleep(100 * time.Millisecond)
	keys, args, err := b.prepare(key, N(10), false, false, smallAmounts[0], b.span, b.flags())
	require.NoError(t, err)
	require.NoError(t, previousAdjust.Run(ctx, rdb, keys, args...).Err()) // the old process's debit
	require.NoError(t, Settle(ctx, b, key, N(-10)))                       // X's refund
	w := <-woke
	t.Logf("W woke at %v (its slot: 2 s)", w)
	assert.GreaterOrEqual(t, w, 1900*time.Millisecond,
		"%.0f admitted by %v, the bucket allows %.0f", 20+10+20-10.0, w, 20+10*w.Seconds())
}

// TestPlaceRateNeverBelowTheRate: the rate a place gives, in millionths
// per second, is what the shift of a credit is divided by (movedTo); read
// below the bucket's rate, it moves a waiter up further than the credit
// is worth. At 1.5e-6/s (a limit of about one call in 8 days, or a rate
// the adaptive law has cut to its floor), a floor to millionths read 1e-6:
// a refund moved waiters up 1.5 times as far as it gave back.
func TestPlaceRateNeverBelowTheRate(t *testing.T) {
	rdb := redistest.Client(t)
	const rate = 1.5e-6
	b := NewRedis(rdb, Limit{Rate: rate, Burst: 1}, WithFailClosed())
	ctx := context.Background()
	key := t.Name() + time.Now().Format("150405.000000")
	_, err := b.Reserve(ctx, key, N(1), 0) // empty
	require.NoError(t, err)
	r, mv, err := b.reserveAt(ctx, key, N(0.5), Unlimited)
	require.NoError(t, err)
	require.True(t, r.OK)
	require.NotEmpty(t, mv.place)
	assert.GreaterOrEqual(t, mv.place[0].rate, rate, "the place's rate")
	q, err := b.earliest(ctx, key, N(0.5))
	require.NoError(t, err)
	require.NotEmpty(t, q.cons)
	assert.GreaterOrEqual(t, q.cons[0].rate, rate, "the queue's rate")
}
