package bucket_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
)

// TestTokenBucketSemantics runs the same scenarios against every token
// bucket backend under controlled time.
func TestTokenBucketSemantics(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()

			t.Run("burst then refill", func(t *testing.T) {
				b := be.new(t, bucket.Limit{Rate: 10, Burst: 5})
				for i := range 5 {
					r, err := b.Reserve(ctx, "burst", bucket.N(1), 0)
					require.NoError(t, err)
					assert.Equal(t, bucket.Reservation{OK: true}, r, "call %d", i)
				}
				r, err := b.Reserve(ctx, "burst", bucket.N(1), 0)
				require.NoError(t, err)
				assert.Equal(t, bucket.Reservation{RetryAfter: 100 * time.Millisecond}, r)
				be.advance(100 * time.Millisecond)
				r, err = b.Reserve(ctx, "burst", bucket.N(1), 0)
				require.NoError(t, err)
				assert.True(t, r.OK)
				assert.InDelta(t, 0, be.tokens(t, "burst")[bucket.Requests], 1e-9)
			})

			t.Run("refill clamps at burst", func(t *testing.T) {
				b := be.new(t, bucket.Limit{Rate: 10, Burst: 5})
				_, err := b.Reserve(ctx, "clamp", bucket.N(5), 0)
				require.NoError(t, err)
				be.advance(10 * time.Second) // would refill 100
				assert.InDelta(t, 5, be.tokens(t, "clamp")[bucket.Requests], 1e-9)
				r, err := b.Reserve(ctx, "clamp", bucket.N(5), 0)
				require.NoError(t, err)
				assert.True(t, r.OK)
				r, err = b.Reserve(ctx, "clamp", bucket.N(1), 0)
				require.NoError(t, err)
				assert.False(t, r.OK)
			})

			t.Run("debt gives exact successive delays", func(t *testing.T) {
				b := be.new(t, bucket.Limit{Rate: 100, Burst: 1})
				for i := range 5 {
					r, err := b.Reserve(ctx, "debt", bucket.N(1), time.Second)
					require.NoError(t, err)
					assert.True(t, r.OK)
					assert.Equal(t, time.Duration(i)*10*time.Millisecond, r.Delay, "waiter %d", i)
				}
				assert.InDelta(t, -4, be.tokens(t, "debt")[bucket.Requests], 1e-9)
				// Past maxWait: nothing taken, RetryAfter is the full wait.
				r, err := b.Reserve(ctx, "debt", bucket.N(1), 49*time.Millisecond)
				require.NoError(t, err)
				assert.Equal(t, bucket.Reservation{RetryAfter: 50 * time.Millisecond}, r)
				assert.InDelta(t, -4, be.tokens(t, "debt")[bucket.Requests], 1e-9)
			})

			t.Run("fractional rate keeps microseconds", func(t *testing.T) {
				b := be.new(t, bucket.PerMinute(7)) // 7/60 per second
				_, err := b.Reserve(ctx, "frac", bucket.N(7), 0)
				require.NoError(t, err)
				r, err := b.Reserve(ctx, "frac", bucket.N(1), 0)
				require.NoError(t, err)
				// 60/7 s = 8.571428571s, rounded up to the backend's unit.
				assert.InDelta(t, (60 * time.Second / 7).Seconds(), r.RetryAfter.Seconds(), 1e-6)
				assert.GreaterOrEqual(t, r.RetryAfter, 60*time.Second/7)
				be.advance(1234567 * time.Microsecond)
				assert.InDelta(t, 1.234567*7/60, be.tokens(t, "frac")[bucket.Requests], 1e-9)
			})

			t.Run("two dimensions all or nothing", func(t *testing.T) {
				b := be.new(t, bucket.PerSecond(10), bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 100, Burst: 1000}))
				cost := bucket.Cost{bucket.Requests: 1, bucket.Tokens: 600}
				r, err := b.Reserve(ctx, "dims", cost, 0)
				require.NoError(t, err)
				assert.True(t, r.OK)
				r, err = b.Reserve(ctx, "dims", cost, 0) // tokens short by 200: 2 s
				require.NoError(t, err)
				assert.Equal(t, bucket.Reservation{RetryAfter: 2 * time.Second}, r)
				assert.Equal(t, bucket.Cost{bucket.Requests: 9, bucket.Tokens: 400}, be.tokens(t, "dims"), "a refused cost takes nothing from any dimension")
				r, err = b.Reserve(ctx, "dims", cost, 2*time.Second)
				require.NoError(t, err)
				assert.Equal(t, bucket.Reservation{OK: true, Delay: 2 * time.Second}, r)
				assert.Equal(t, bucket.Cost{bucket.Requests: 8, bucket.Tokens: -200}, be.tokens(t, "dims"))
				// A cost that leaves out a dimension does not touch it.
				_, err = b.Reserve(ctx, "dims", bucket.N(1), 0)
				require.NoError(t, err)
				assert.Equal(t, bucket.Cost{bucket.Requests: 7, bucket.Tokens: -200}, be.tokens(t, "dims"))
			})

			t.Run("adjust refunds up to burst and debits into debt", func(t *testing.T) {
				b := be.new(t, bucket.Limit{Rate: 1, Burst: 10})
				_, err := b.Reserve(ctx, "adj", bucket.N(8), 0)
				require.NoError(t, err)
				require.NoError(t, b.Adjust(ctx, "adj", bucket.N(-3)))
				assert.InDelta(t, 5, be.tokens(t, "adj")[bucket.Requests], 1e-9)
				require.NoError(t, b.Adjust(ctx, "adj", bucket.N(-100)))
				assert.InDelta(t, 10, be.tokens(t, "adj")[bucket.Requests], 1e-9)
				require.NoError(t, b.Adjust(ctx, "adj", bucket.N(8)))
				require.NoError(t, b.Adjust(ctx, "adj", bucket.N(7)))
				assert.InDelta(t, -5, be.tokens(t, "adj")[bucket.Requests], 1e-9)
				r, err := b.Reserve(ctx, "adj", bucket.N(1), 0)
				require.NoError(t, err)
				assert.Equal(t, bucket.Reservation{RetryAfter: 6 * time.Second}, r)
				err = b.Adjust(ctx, "adj", bucket.N(math.NaN()))
				assert.ErrorIs(t, err, bucket.ErrInvalidCost)
			})

			t.Run("impossible costs fail at once", func(t *testing.T) {
				b := be.new(t, bucket.PerSecond(5), bucket.WithLimit(bucket.Tokens, bucket.PerSecond(100)))
				for _, tc := range []struct {
					cost bucket.Cost
					want error
				}{
					{bucket.N(6), bucket.ErrExceedsBurst},
					{bucket.Cost{bucket.Requests: 1, bucket.Tokens: 101}, bucket.ErrExceedsBurst},
					{bucket.N(-1), bucket.ErrInvalidCost},
					{bucket.N(math.NaN()), bucket.ErrInvalidCost},
					{bucket.N(math.Inf(1)), bucket.ErrInvalidCost},
				} {
					r, err := b.Reserve(ctx, "impossible", tc.cost, time.Hour)
					assert.ErrorIs(t, err, tc.want, "%v", tc.cost)
					var ce *bucket.CostError
					assert.True(t, errors.As(err, &ce))
					assert.False(t, r.OK)
				}
				assert.Equal(t, bucket.Cost{bucket.Requests: 5, bucket.Tokens: 100}, be.tokens(t, "impossible"))
			})

			// Regression: amounts and waits like 1e6 were sent as "1e+06",
			// which gopher-lua's tonumber (miniredis) does not read.
			t.Run("large amounts and waits", func(t *testing.T) {
				b := be.new(t, bucket.PerSecond(1), bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 1e6, Burst: 2e6}))
				cost := bucket.Cost{bucket.Tokens: 1e6}
				for _, want := range []time.Duration{0, 0, time.Second} {
					r, err := b.Reserve(ctx, "large", cost, 1000*time.Second)
					require.NoError(t, err)
					assert.Equal(t, bucket.Reservation{OK: true, Delay: want}, r)
				}
			})

			// Regression: a remainder of 2e-6 tokens was written as "2e-06",
			// which miniredis then failed to read.
			t.Run("tiny remainders", func(t *testing.T) {
				b := be.new(t, bucket.Limit{Rate: 1, Burst: 2})
				_, err := b.Reserve(ctx, "tiny", bucket.N(2), 0)
				require.NoError(t, err)
				require.NoError(t, b.Adjust(ctx, "tiny", bucket.N(-0.000002)))
				assert.InDelta(t, 2e-6, be.tokens(t, "tiny")[bucket.Requests], 1e-9)
				r, err := b.Reserve(ctx, "tiny", bucket.N(0.5), time.Second)
				require.NoError(t, err)
				assert.Equal(t, bucket.Reservation{OK: true, Delay: 499998 * time.Microsecond}, r)
			})

			t.Run("unlimited dimensions are free", func(t *testing.T) {
				b := be.new(t, bucket.PerSecond(1))
				r, err := b.Reserve(ctx, "free", bucket.Cost{"images": 1e9}, 0)
				require.NoError(t, err)
				assert.True(t, r.OK)
			})
		})
	}
}
