package wait_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/internal/wait"
)

func TestSleep(t *testing.T) {
	assert.NoError(t, wait.Sleep(t.Context(), 0))
	assert.NoError(t, wait.Sleep(t.Context(), time.Millisecond))

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	assert.ErrorIs(t, wait.Sleep(ctx, 0), context.Canceled, "done already")
	start := time.Now()
	assert.ErrorIs(t, wait.Sleep(ctx, time.Hour), context.Canceled)
	assert.Less(t, time.Since(start), time.Second, "returned when ctx was done")
}

func TestSeconds(t *testing.T) {
	for _, tc := range []struct {
		sec  float64
		want time.Duration
	}{
		{0, 0}, {-1, 0}, {math.NaN(), 0}, {math.Inf(-1), 0},
		{1, time.Second}, {0.25, 250 * time.Millisecond},
		{1e-10, 1}, // rounded up: never early
		{0.1, 100 * time.Millisecond},
		{math.Inf(1), math.MaxInt64}, {1e300, math.MaxInt64}, {math.MaxInt64 / 1e9, math.MaxInt64},
	} {
		assert.Equal(t, tc.want, wait.Seconds(tc.sec), "%v", tc.sec)
	}
}

func TestAdd(t *testing.T) {
	assert.Equal(t, 3*time.Second, wait.Add(time.Second, 2*time.Second))
	assert.Equal(t, time.Duration(math.MaxInt64), wait.Add(math.MaxInt64-1, 2), "saturated")
	assert.Equal(t, time.Duration(math.MaxInt64), wait.Add(math.MaxInt64, math.MaxInt64))
}

func TestDetached(t *testing.T) {
	type key struct{}
	parent, cancel := context.WithCancel(context.WithValue(t.Context(), key{}, "v"))
	cancel()
	ctx, stop := wait.Detached(parent)
	defer stop()
	assert.NoError(t, ctx.Err(), "not cancelled with its parent")
	assert.Equal(t, "v", ctx.Value(key{}))
	dl, ok := ctx.Deadline()
	assert.True(t, ok)
	assert.WithinDuration(t, time.Now().Add(wait.DetachedTimeout), dl, time.Second)
}
