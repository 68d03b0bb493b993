package bucket

import (
	"context"
	"sync/atomic"
	"time"
)

// deadlineGrain is how much sooner than its timeout a call may have to
// end: the age, at most, of the shared deadline it is given (see
// deadlines).
const deadlineGrain = time.Millisecond

// deadlines bounds calls to Redis in time (failover.call). A context's
// own timer costs a call five allocations and a timer, which Go adds to
// the heap and, when it is the earliest there, wakes another thread for:
// 1.1 µs of the 6 µs of CPU that a Reserve spent outside go-redis
// (docs/performance.md). So the calls whose context is never cancelled
// (context.Background, a WithoutCancel: its Done is nil) share one: a call
// has the deadline of a context made at most deadlineGrain before it, with
// its timeout then, if that is no later than its own; a context with a
// deadline of its own that comes first needs none. Others (a cancellable
// context with a later deadline or none) get a timer of their own, as
// context.WithTimeout gives. Either way, no call outlives its timeout: the
// shared deadline is never later, and at most deadlineGrain sooner. The
// zero value is ready to use, and it is safe for concurrent use.
type deadlines struct {
	last atomic.Pointer[sharedDeadline]
}

// sharedDeadline is a context that only its deadline ends.
type sharedDeadline struct {
	ctx    context.Context
	at     time.Time
	cancel context.CancelFunc // never called: its timer ends it
}

// within returns ctx bounded to timeout from now, the time, and what to
// call when the call is over.
func (d *deadlines) within(ctx context.Context, now time.Time, timeout time.Duration) (context.Context, context.CancelFunc) {
	at := now.Add(timeout)
	if dl, ok := ctx.Deadline(); ok && !dl.After(at) {
		return ctx, func() {}
	}
	if ctx.Done() != nil {
		return context.WithDeadline(ctx, at)
	}
	sd := d.last.Load()
	// A timeout shorter than two grains reuses one only within half of
	// it, or a call could get a deadline already past
	// (TestDeadlinesShortTimeout).
	if sd == nil || sd.at.After(at) || at.Sub(sd.at) > min(deadlineGrain, timeout/2) {
		sctx, cancel := context.WithDeadline(context.Background(), at)
		sd = &sharedDeadline{ctx: sctx, at: at, cancel: cancel}
		d.last.Store(sd)
	}
	return boundCtx{ctx, sd.ctx}, func() {}
}

// boundCtx has the values of a context that is never done, and the
// deadline of another.
type boundCtx struct {
	context.Context // the values'
	timer           context.Context
}

func (c boundCtx) Deadline() (time.Time, bool) { return c.timer.Deadline() }
func (c boundCtx) Done() <-chan struct{}       { return c.timer.Done() }
func (c boundCtx) Err() error                  { return c.timer.Err() }

// AfterFunc lets a context derived from c (context.WithCancel, as a
// client's command may make) follow c's end without a goroutine of its
// own to watch it.
func (c boundCtx) AfterFunc(f func()) func() bool { return context.AfterFunc(c.timer, f) }
