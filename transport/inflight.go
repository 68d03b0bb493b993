package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// WithInFlight bounds the calls in flight on each key to what s allows: at
// most n across the fleet with a bucket.InFlight, in this process with a
// bucket.LocalInFlight. Each attempt takes a slot of its key first, then
// waits on the bucket (WithBucket); the slot is held while the request is
// sent and its response streams, and given back when the body has been
// read to its end (or a read fails) or closed, when the request's context
// ends, or, for a body dropped unclosed, when it is garbage collected (net/http
// leaks its connection then: close bodies); at once if the attempt fails
// or its response has no body. A retry's response is drained and closed
// before its backoff, so no slot is held while a call sleeps.
//
// The slot comes before the rate: a call waiting for a slot has taken no
// token. A token taken first would be spent while the call queues, and the
// calls that slots freed together (a long call ending, a dead process's
// leases) would reach the provider as a burst the bucket never allowed.
// The price is a slot held while its call waits for a token, which costs
// nothing when the rate binds and little when it does not: the bucket's
// wait is then short.
//
// The wait for a slot counts toward WithMaxWait: past it, the attempt fails
// with an error that errors.Is bucket.ErrDeadline, having taken nothing.
func WithInFlight(s bucket.Semaphore) Option {
	return optionFunc(func(c *config) {
		if s != nil {
			c.inflight = s
		}
	})
}

// noSlot is the release of an attempt that holds no slot.
func noSlot() {}

// slot takes one of key's in-flight slots, waiting at most maxWait, and
// says how long it waited.
func (t *Transport) slot(ctx context.Context, key string, maxWait time.Duration) (func(), time.Duration, error) {
	start := t.cfg.now()
	actx := ctx
	if maxWait != bucket.Unlimited {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, max(maxWait, 0))
		defer cancel()
	}
	release, err := t.cfg.inflight.Acquire(actx, key)
	waited := t.cfg.now().Sub(start)
	switch {
	case err == nil:
		return release, waited, nil
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return nil, waited, err
	case actx.Err() != nil && errors.Is(err, actx.Err()):
		return nil, waited, fmt.Errorf("transport: no in-flight slot within the max wait %v: %w", maxWait, bucket.ErrDeadline)
	}
	return nil, waited, fmt.Errorf("transport: %w", err)
}

// holdSlot has resp's body give the attempt's slot back, with release,
// when it is read to its end or fails, is closed, or is collected unclosed,
// or when ctx ends; at once if resp has no body.
func holdSlot(ctx context.Context, resp *http.Response, release func()) {
	if resp.Body == nil || resp.Body == http.NoBody {
		release()
		return
	}
	h := &slotHold{release: release}
	stop := context.AfterFunc(ctx, h.done)
	h.mu.Lock()
	h.stop = stop
	h.mu.Unlock()
	b := &slotBody{body: resp.Body, hold: h}
	runtime.AddCleanup(b, (*slotHold).done, h)
	if rw, ok := resp.Body.(io.ReadWriteCloser); ok { // a 101's connection
		resp.Body = &slotRWBody{slotBody: b, w: rw}
		return
	}
	resp.Body = b
}

// slotHold is an attempt's slot, given back once.
type slotHold struct {
	once    sync.Once
	release func()
	mu      sync.Mutex
	stop    func() bool // the context.AfterFunc's
}

func (h *slotHold) done() {
	h.once.Do(h.release)
	h.mu.Lock()
	stop := h.stop
	h.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// slotBody is a response body that gives its attempt's slot back.
type slotBody struct {
	body io.ReadCloser
	hold *slotHold
}

func (b *slotBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if err != nil {
		b.hold.done()
	}
	return n, err
}

func (b *slotBody) Close() error {
	err := b.body.Close()
	b.hold.done()
	return err
}

// slotRWBody is a slotBody that writes too, as a 101 response's body does.
type slotRWBody struct {
	*slotBody
	w io.Writer
}

func (b *slotRWBody) Write(p []byte) (int, error) { return b.w.Write(p) }
