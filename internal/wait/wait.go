// Package wait holds what every package of sluice that waits does alike:
// sleep within a context, convert a computed delay to a Duration, and bound
// the calls that must outlive the caller's context.
package wait

import (
	"context"
	"math"
	"time"
)

// Sleep waits for d, or until ctx is done, with a timer it stops: nobody
// polls, and nothing is left running. It returns ctx's error if ctx is done
// first, or is done already when d <= 0.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Seconds converts sec seconds to a Duration, rounding up to the
// nanosecond so that a waiter never wakes before its time, and saturating
// at the longest Duration. It is 0 for sec <= 0, and for NaN.
func Seconds(sec float64) time.Duration {
	if !(sec > 0) {
		return 0
	}
	ns := math.Ceil(sec * 1e9)
	if ns >= math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(ns)
}

// Add returns a+b for a, b >= 0, saturating at the longest Duration.
func Add(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return time.Duration(math.MaxInt64)
	}
	return a + b
}

// DetachedTimeout bounds a call made under Detached.
const DetachedTimeout = 2 * time.Second

// Detached returns a context for a call that must outlive ctx, such as the
// refund of a wait ctx cancelled, or an observation made as the caller
// gives up: it carries ctx's values but not its cancellation, and ends
// after DetachedTimeout.
func Detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), DetachedTimeout)
}
