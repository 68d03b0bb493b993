package bucket_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestSettleRefundIsBoundedByABurst: a refund gives back at most a burst,
// as a debit takes at most one: no call can cost more. At 10/s (burst 10)
// the burst is spent and 30 waiters queue (slots 0.1 to 3 s); then
// Settle(-1e12), a served call's refund that no call took (a wrapper's or
// user code's). Before, it filled the key and credited 1e12 to every
// waiter's place: all 40 went within 0.5 s (Redis and Local), where the key
// allows Burst + Rate·T = 15, plus the one burst a refund may give back.
func TestSettleRefundIsBoundedByABurst(t *testing.T) {
	l := bucket.Limit{Rate: 10, Burst: 10}
	for name, b := range map[string]bucket.Bucket{
		"local": bucket.NewLocal(l),
		"redis": bucket.NewRedis(redistest.Client(t), l, bucket.WithFailClosed()),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			key := uniqueKey(t)
			start := time.Now()
			var admitted atomic.Int64
			for range 10 {
				_, err := bucket.Wait(ctx, b, key, bucket.N(1))
				require.NoError(t, err)
				admitted.Add(1)
			}
			const waiters = 30
			for range waiters {
				go func() {
					if _, err := bucket.Wait(ctx, b, key, bucket.N(1)); assert.NoError(t, err) {
						admitted.Add(1)
					}
				}()
			}
			tokens := func() float64 {
				if r, ok := b.(*bucket.Redis); ok {
					c, err := r.Tokens(ctx, key)
					require.NoError(t, err)
					return c[bucket.Requests]
				}
				return b.(*bucket.Local).Tokens(key)[bucket.Requests]
			}
			require.Eventually(t, func() bool { return tokens() < -waiters+2 }, 5*time.Second, time.Millisecond, "the waiters queue")
			require.NoError(t, bucket.Settle(ctx, b, key, bucket.N(-1e12)))
			time.Sleep(time.Until(start.Add(450 * time.Millisecond)))
			got, span := admitted.Load(), time.Since(start)
			bound := l.Burst + l.Rate*span.Seconds() + l.Burst
			t.Logf("admitted %d in %v; Burst + Rate·T + one refund's burst = %.1f", got, span.Round(time.Millisecond), bound)
			assert.LessOrEqual(t, float64(got), bound+1)
		})
	}
}
