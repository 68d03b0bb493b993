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

// TestServedRefundMovesEveryWaiterUp: a refund of a call served (Settle)
// is capacity that every reservation still waiting had counted as taken,
// and moves each one up by it, not only the end of the queue. At 10/s with
// a burst of 20, X empties the key and is served; W1 waits for 20 (slot
// 2 s), W2 for 20 behind it (slot 4 s); at 0.2 s X gives its 20 back. The
// bucket allows 20 + 10·T + 20 by T: W1 may go at once, W2 at 2 s. With
// the end of the queue only, W2 moves to 2 s and W1 keeps 2 s. A refund
// through Adjust, which may be a reservation's never served, moves W1 not.
func TestServedRefundMovesEveryWaiterUp(t *testing.T) {
	l := bucket.Limit{Rate: 10, Burst: 20}
	r1 := bucket.NewRedis(redistest.Client(t), l, bucket.WithFailClosed())
	r2 := bucket.NewRedis(redistest.Client(t), l, bucket.WithFailClosed())
	routed := bucket.Route(func(string) string { return "" }, nil, r1)
	loc := bucket.NewLocal(l)
	routedLocal := bucket.Route(func(string) string { return "" }, nil, bucket.NewLocal(l))
	cases := map[string]struct {
		w, x   bucket.Bucket // the waiters' process, X's
		settle bool
		// w1 is when W1 must wake by: at once, or at the first re-read of
		// a waiter of another process (about 0.5 s).
		w1 time.Duration
	}{
		"same-process":  {r1, r1, true, 600 * time.Millisecond},
		"other-process": {r1, r2, true, 1200 * time.Millisecond},
		"route":         {routed, routed, true, 600 * time.Millisecond},
		"adjust":        {r1, r1, false, 0},
		"local":         {loc, loc, true, 600 * time.Millisecond},
		"local/adjust":  {loc, loc, false, 0},
		"local/route":   {routedLocal, routedLocal, true, 600 * time.Millisecond},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			key := uniqueKey(t)
			start := time.Now()
			r, err := c.x.Reserve(ctx, key, bucket.N(20), 0) // X, served at once
			require.NoError(t, err)
			require.True(t, r.OK)
			woke := make([]chan time.Duration, 2)
			for i := range woke {
				woke[i] = make(chan time.Duration, 1)
				go func() {
					_, err := bucket.WaitMax(ctx, c.w, key, bucket.N(20), time.Minute)
					assert.NoError(t, err)
					woke[i] <- time.Since(start)
				}()
				time.Sleep(50 * time.Millisecond) // W1 reserves first
			}
			time.Sleep(100 * time.Millisecond)
			if c.settle {
				require.NoError(t, bucket.Settle(ctx, c.x, key, bucket.N(-20)))
			} else {
				require.NoError(t, c.x.Adjust(ctx, key, bucket.N(-20)))
			}
			w1, w2 := <-woke[0], <-woke[1]
			t.Logf("W1 woke at %v (its slot: 2 s), W2 at %v (its slot: 4 s)", w1, w2)
			if c.w1 > 0 {
				assert.Less(t, w1, c.w1, "W1 moved up by the refund")
			} else {
				assert.GreaterOrEqual(t, w1, 1900*time.Millisecond, "W1 kept its slot")
			}
			assert.GreaterOrEqual(t, w2, 1950*time.Millisecond, "60 admitted by %v, the bucket allows %.0f", w2, 40+l.Rate*w2.Seconds())
			assert.Less(t, w2, 2600*time.Millisecond, "W2 moved up to the end of the queue")
		})
	}
}

// TestServedRefundMovesNoWaiterIntoAPause: a pause that comes after a
// waiter reserved holds it no later than its slot, as before, but the
// refunds since do not move it into the pause. At 10/s with a burst of
// 20: X empties the key, W waits for 20 (slot 2 s); a refusal pauses the
// key for 1.5 s; X gives its 20 back. W goes at the pause's end, not at
// once.
func TestServedRefundMovesNoWaiterIntoAPause(t *testing.T) {
	l := bucket.Limit{Rate: 10, Burst: 20}
	for name, b := range map[string]bucket.Bucket{
		"redis": bucket.NewRedis(redistest.Client(t), l, bucket.WithFailClosed()),
		"local": bucket.NewLocal(l),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			waitThroughPause(t, b)
		})
	}
}

func waitThroughPause(t *testing.T, b bucket.Bucket) {
	ctx := context.Background()
	key := uniqueKey(t)
	start := time.Now()
	_, err := b.Reserve(ctx, key, bucket.N(20), 0)
	require.NoError(t, err)
	woke := make(chan time.Duration, 1)
	go func() {
		_, err := bucket.WaitMax(ctx, b, key, bucket.N(20), time.Minute)
		assert.NoError(t, err)
		woke <- time.Since(start)
	}()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: 1500 * time.Millisecond}))
	require.NoError(t, bucket.Settle(ctx, b, key, bucket.N(-20)))
	w := <-woke
	t.Logf("W woke at %v (its slot 2 s, the pause until 1.6 s)", w)
	assert.GreaterOrEqual(t, w, 1550*time.Millisecond, "W went during the pause")
	assert.Less(t, w, 1950*time.Millisecond, "W moved up to the pause's end")
}
