package transport

import (
	"context"
	"time"
)

// WithTestClock makes the Transport read time from now and wait with sleep
// (retry delays and Retry-After pauses; the bucket keeps its own clock).
func WithTestClock(now func() time.Time, sleep func(context.Context, time.Duration) error) Option {
	return optionFunc(func(c *config) { c.now, c.sleep = now, sleep })
}

// WithTestRand makes jitter draw from f.
func WithTestRand(f func() float64) Option {
	return optionFunc(func(c *config) { c.rand = f })
}
