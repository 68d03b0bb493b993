package bucket

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

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
