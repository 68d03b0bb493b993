package transport

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/wait"
)

// UsageMeter measures what a call actually cost from its response body, as
// the caller reads it. WithUsage makes one per response.
type UsageMeter interface {
	// Write is given the body's bytes in order, as the caller reads them;
	// it must not keep p. An error stops the metering: the charge stands.
	Write(p []byte) (int, error)
	// Cost returns what the call cost in each dimension the body reported,
	// and whether the body reported it. It is called once, after the last
	// Write.
	Cost() (bucket.Cost, bool)
}

// A FeedbackMeter is a UsageMeter that also reads what the body says about
// the limit: an error event in an event stream whose status was 2xx, such
// as Anthropic's overloaded_error or a rate-limit error that ends a
// stream. What it finds is told to the bucket for the key, for the whole
// fleet, when the body ends (or is closed), as a refusal's status and
// headers would be: a pause for the delay it asks, a decrease if it is a
// rate limit. The call is not retried: the caller has its response.
// llmclient.MeterUsage returns one for event streams.
type FeedbackMeter interface {
	UsageMeter
	// Feedback returns what the body said about the limit, and whether it
	// said anything. It is called once, after Cost.
	Feedback() (adaptive.Feedback, bool)
}

// A StreamMeter is a UsageMeter of a body whose usage is final only once
// the body has ended: an event stream, which may report its usage as it
// goes (cumulative counts, as some servers send with every chunk) before
// its last event. The Transport calls End, before Cost, when the caller
// reads the body to its end (io.EOF); a body closed before that, or broken
// off, has not ended, unless the meter saw its end for itself (such as a
// stream's last event), and its Cost should then report nothing: the
// charge stands, as the provider counts what it generated.
// llmclient.MeterUsage returns one for event streams.
type StreamMeter interface {
	UsageMeter
	// End says the body was read to its end. It is called at most once,
	// after the last Write.
	End()
}

// WithUsage reconciles what each call is charged with what it cost. For the
// response RoundTrip returns, f returns a UsageMeter, or nil if the response
// will not report its usage (f must not read the body); the body is then
// read through the meter, unbuffered: the caller reads the same bytes, as
// they arrive. When the caller reaches the end of the body (or a read error)
// or closes it, whichever comes first, each dimension the meter reports is
// adjusted by actual − charged: a refund if the call cost less than it was
// charged, a debit if it cost more. The charge is that of the attempt that
// produced the response, what it kept of it if it was a refusal (see
// Transport); a dimension it lacks counts as zero charged. The
// adjustment is made with bucket.Adjust under a context detached from the
// request's, bounded to 2s, in the goroutine that reads or closes the body.
//
// If the usage never shows (the body is closed before it, the stream breaks
// off, the response has none), or shows only in part (a StreamMeter's
// stream closed or broken off before its end), the charge stands: the
// bucket errs on the side of the provider's limit. A usage report is outside input: an amount
// that is not a number, infinite or negative is no report (the charge
// stands in that dimension), and so is one above 1e9, more than the burst
// of any bucket, which no call can cost; so that a refund is never larger
// than the charge, and a lie never reaches the bucket (which bounds every
// debit at the dimension's burst besides). Without a bucket (WithBucket) there is
// nothing to reconcile and f is not called. llmclient.MeterUsage reads the
// usage of OpenAI-compatible and Anthropic responses.
func WithUsage(f func(*http.Response) UsageMeter) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.usage = f
		}
	})
}

// metered returns resp with its body read through a UsageMeter, if
// WithUsage gives one for it; charged is what the attempt that produced resp
// took from key, epoch its reservation's.
func (t *Transport) metered(ctx context.Context, key string, charged bucket.Cost, epoch uint64, resp *http.Response) *http.Response {
	if resp == nil || t.cfg.usage == nil || t.cfg.bucket == nil || resp.Body == nil || resp.Body == http.NoBody {
		return resp
	}
	m := t.cfg.usage(resp)
	if m == nil {
		return resp
	}
	resp.Body = &meteredBody{body: resp.Body, t: t, ctx: ctx, key: key, charged: charged, epoch: epoch, meter: m}
	return resp
}

// meteredBody is a response body read through a UsageMeter, which
// reconciles the charge at the end of the body or at Close.
type meteredBody struct {
	body    io.ReadCloser
	t       *Transport
	ctx     context.Context
	key     string
	charged bucket.Cost
	epoch   uint64

	mu    sync.Mutex // Close may be called while Read is
	meter UsageMeter // nil once reconciled or given up
}

func (b *meteredBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.meter == nil {
		return n, err
	}
	if n > 0 {
		if _, werr := b.meter.Write(p[:n]); werr != nil {
			b.meter = nil
			return n, err
		}
	}
	if err != nil {
		if sm, ok := b.meter.(StreamMeter); ok && err == io.EOF {
			sm.End()
		}
		b.finish()
	}
	return n, err
}

func (b *meteredBody) Close() error {
	err := b.body.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.meter != nil {
		b.finish()
	}
	return err
}

// finish reconciles the charge with the meter's cost, if it found one, and
// observes what the body said about the limit, if it is a FeedbackMeter
// that found something. b.mu must be held and b.meter set.
func (b *meteredBody) finish() {
	m := b.meter
	b.meter = nil
	if actual, ok := m.Cost(); ok {
		b.t.reconcile(b.ctx, b.key, b.charged, actual)
	}
	if fm, ok := m.(FeedbackMeter); ok {
		if fb, ok := fm.Feedback(); ok && fb.Class != adaptive.Accepted {
			b.t.observe(b.ctx, b.key, b.epoch, reply{fb: fb}, b.t.cfg.now())
		}
	}
}

// maxUsage is the most a call can have cost in one dimension: the largest
// burst of a bucket.Limit (see WithUsage).
const maxUsage = 1e9

// reconcile adjusts key by what a call cost beyond what it was charged.
func (t *Transport) reconcile(ctx context.Context, key string, charged, actual bucket.Cost) {
	delta := make(bucket.Cost, len(actual))
	for dim, v := range actual {
		if !(v >= 0 && v <= maxUsage) {
			continue // NaN, infinite, negative or beyond any burst: no report
		}
		if d := v - charged[dim]; d != 0 {
			delta[dim] = d
		}
	}
	if len(delta) == 0 {
		return
	}
	rctx, cancel := wait.Detached(ctx)
	defer cancel()
	if err := bucket.Settle(rctx, t.cfg.bucket, key, delta); err != nil {
		t.debugKey(ctx, "sluice: usage reconciliation failed", errAttr(err))
		return
	}
	up, down := bucket.Cost{}, bucket.Cost{}
	for dim, d := range delta {
		if _, ok := charged[dim]; !ok {
			continue // not the call's: see Stats.Debited
		}
		if d > 0 {
			up[dim] = d
		} else {
			down[dim] = -d
		}
	}
	t.ledger.add(debited, up)
	t.ledger.add(refunded, down)
	if l := t.logger(ctx); l != nil {
		attrs := make([]slog.Attr, 0, len(delta))
		for dim, d := range delta {
			attrs = append(attrs, slog.Float64(dim, d))
		}
		l.LogAttrs(ctx, slog.LevelDebug, "sluice: usage reconciled", slog.Any("delta", slog.GroupValue(attrs...)))
	}
}
