package bucket

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type ctxKey struct{}

// TestDeadlinesWithin: a call's context never ends later than its timeout,
// nor more than deadlineGrain sooner, keeps the caller's values, and ends
// when the caller's does.
func TestDeadlinesWithin(t *testing.T) {
	const timeout = 200 * time.Millisecond
	var d deadlines
	check := func(t *testing.T, ctx context.Context, cctx context.Context, before, after time.Time) {
		t.Helper()
		dl, ok := cctx.Deadline()
		require.True(t, ok)
		assert.False(t, dl.After(after.Add(timeout)), "never past the timeout")
		assert.False(t, dl.Before(before.Add(timeout-deadlineGrain)), "at most a grain sooner")
		assert.Equal(t, "v", cctx.Value(ctxKey{}), "the caller's values")
		assert.NoError(t, cctx.Err())
	}

	t.Run("never cancelled", func(t *testing.T) {
		ctx := context.WithValue(context.Background(), ctxKey{}, "v")
		before := time.Now()
		c1, cancel1 := d.within(ctx, time.Now(), timeout)
		c2, cancel2 := d.within(ctx, time.Now(), timeout)
		after := time.Now()
		check(t, ctx, c1, before, after)
		check(t, ctx, c2, before, after)
		cancel1()
		cancel2()
		assert.NoError(t, c1.Err(), "ended by its deadline only: others share it")

		// A shorter timeout never gets a later shared deadline.
		before = time.Now()
		c3, cancel3 := d.within(ctx, time.Now(), timeout/2)
		defer cancel3()
		dl, _ := c3.Deadline()
		assert.False(t, dl.After(time.Now().Add(timeout/2)))
		assert.False(t, dl.Before(before.Add(timeout/2-deadlineGrain)))

		short, cancel4 := d.within(ctx, time.Now(), 20*time.Millisecond)
		defer cancel4()
		select {
		case <-short.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("a shared deadline did not end its context")
		}
		assert.ErrorIs(t, short.Err(), context.DeadlineExceeded)
		assert.False(t, time.Now().Before(func() time.Time { dl, _ := short.Deadline(); return dl }()))
	})

	t.Run("cancellable", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
		before := time.Now()
		cctx, done := d.within(parent, time.Now(), timeout)
		defer done()
		check(t, parent, cctx, before, time.Now())
		cancel()
		select {
		case <-cctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the caller's cancellation did not end the call's context")
		}
		assert.ErrorIs(t, cctx.Err(), context.Canceled)
	})

	t.Run("caller's deadline first", func(t *testing.T) {
		parent, cancel := context.WithTimeout(context.WithValue(context.Background(), ctxKey{}, "v"), timeout/2)
		defer cancel()
		cctx, done := d.within(parent, time.Now(), timeout)
		defer done()
		assert.Equal(t, parent, cctx, "the caller's context bounds it already")
	})
}

// TestDeadlinesShortTimeout: a timeout shorter than deadlineGrain
// (WithRedisTimeout(500 µs), or the stretch of a fast local Redis) must
// still leave a call some time: the shared deadline of a call begun
// 0.9 ms before, with the same timeout, has passed when the next begins,
// and that call would fail at once, a Redis failure, without being sent.
func TestDeadlinesShortTimeout(t *testing.T) {
	const timeout = 500 * time.Microsecond
	var d deadlines
	t0 := time.Now()
	_, cancel1 := d.within(context.Background(), t0, timeout)
	defer cancel1()
	t1 := t0.Add(900 * time.Microsecond)
	c2, cancel2 := d.within(context.Background(), t1, timeout)
	defer cancel2()
	dl, ok := c2.Deadline()
	assert.True(t, ok)
	assert.True(t, dl.After(t1), "the deadline of a call begun at %v is %v: past before it begins", t1.Sub(t0), dl.Sub(t0))
}

// TestDerivedFromSharedDeadline: a context derived from a shared deadline
// (WithCancel) ends with it, and starts no goroutine to watch it.
func TestDerivedFromSharedDeadline(t *testing.T) {
	var d deadlines
	c, cancel := d.within(context.Background(), time.Now(), 20*time.Millisecond)
	defer cancel()
	before := runtime.NumGoroutine()
	derived, stop := context.WithCancel(c)
	defer stop()
	assert.Equal(t, before, runtime.NumGoroutine(), "no goroutine watches the shared deadline")
	select {
	case <-derived.Done():
		assert.ErrorIs(t, derived.Err(), context.DeadlineExceeded)
	case <-time.After(5 * time.Second):
		t.Fatal("the derived context outlived the deadline")
	}
}
