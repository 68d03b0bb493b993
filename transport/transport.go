package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/peek"
	"github.com/sluicehq/sluice/internal/wait"
)

// Transport is an http.RoundTripper that sends each request through base
// once the request's key has the quota for it. Every attempt, retries
// included, waits on the bucket (WithBucket), then asks the circuit breaker
// (WithBreaker), then sends a clone of the request; a failed attempt is
// retried as Retry describes. The response returned is the last attempt's,
// unread and untouched: its body streams as the upstream writes it.
//
// What each response says about the limit (adaptive.Parse) goes to the
// bucket's Observe, which applies it for every process sharing the bucket.
// A 429 or 503 (or 529, or a 403 that says it is a rate limit) with a
// Retry-After, or whose body asks for a delay (adaptive.ParseBody), also
// holds back every request of its key sent through this Transport until
// that time (at most Retry.MaxRetryAfter), even one whose slot was already
// reserved.
//
// An attempt refused for rate or load that waiting cures (a 429 that is no
// spent quota; a 503 or 529 that asks for a delay) keeps its charge of
// requests and gives back the rest of its cost, its tokens, which the
// provider did not count, but in a dimension whose remaining the refusal
// reports: the bucket has just been brought to it. The law (Observe) has
// slowed the fleet for the refusal already; a retry is charged anew.
//
// Transport is safe for concurrent use.
type Transport struct {
	base    http.RoundTripper
	cfg     config
	breaker *breaker // nil: none
	pauses  pauses
	sampler sampler
	metrics *metrics
	ledger  ledger
}

var _ http.RoundTripper = (*Transport)(nil)

// New returns a Transport that sends requests through base
// (http.DefaultTransport if nil).
func New(base http.RoundTripper, opts ...Option) *Transport {
	if base == nil {
		base = http.DefaultTransport
	}
	t := &Transport{base: base, cfg: newConfig(opts)}
	t.metrics = newMetrics(t.cfg.meters, t.cfg.attrs)
	if t.cfg.breaker != nil {
		t.breaker = newBreaker(*t.cfg.breaker, t.breakerChanged)
		t.metrics.breakerState(t.breaker.name, gobreaker.StateClosed)
	}
	return t
}

// NewClient returns an http.Client whose Transport is New(nil, opts...).
func NewClient(opts ...Option) *http.Client {
	return &http.Client{Transport: New(nil, opts...)}
}

// CloseIdleConnections closes the idle connections of the base
// RoundTripper, if it has a CloseIdleConnections method.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// RoundTrip implements http.RoundTripper. It never modifies req. Errors
// are the base RoundTripper's, the context's, a *BreakerError, or the
// bucket's wrapped (a wait that would pass the deadline or the max wait
// errors.Is bucket.ErrDeadline). When a retry cannot be sent (its wait
// would pass the deadline or the max wait, the breaker refuses it, the
// bucket or GetBody fails) the previous response is returned instead, with
// a nil error, if it was short enough (4 KiB) to be kept in memory and
// came whole within 250ms.
//
// Each attempt's response is read once, into a reply (see read): the
// pause of its key, what the bucket is told, and the retry (see
// Retry.decide) are all decided from that.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	key := t.cfg.key(req)
	var cost bucket.Cost
	if t.cfg.bucket != nil {
		cost = t.cfg.cost(req)
	}
	var (
		tr      tries
		waited  time.Duration  // by the attempts and between them
		last    *http.Response // the discarded response, kept in memory
		lastRep reply          // what it said
	)
	for n := 1; ; n++ {
		resp, rep, sent, err := t.attempt(ctx, req, key, cost, n, &waited)
		if !sent {
			t.ended(ctx, req, n-1, tr, waited)
			return t.unsent(ctx, req, key, n, err, last, lastRep)
		}
		last = nil
		refused := t.cfg.retry.refused(rep, err, t.cfg.bucket != nil)
		delay, why := t.cfg.retry.decide(ctx, req, n, rep, err, tr, t.cfg.bucket != nil, t.cfg.now(), t.cfg.rand())
		if why.retry() && refused && waited+delay > t.cfg.maxWait {
			why = finalMaxWait // refusals are waited out within WithMaxWait, in all
		}
		if !why.retry() {
			if l := t.logger(ctx); l != nil && why.logged() {
				logReq(ctx, l, req, "sluice: not retrying: "+why.String(), slog.Int("attempt", n),
					slog.Int("status", rep.status), slog.Duration("delay", delay))
			}
			t.ended(ctx, req, n, tr, waited)
			return t.metered(ctx, key, rep.charged, rep.epoch, resp), err
		}
		tr = tr.after(why, refused)
		last, lastRep = drained(resp), rep
		t.metrics.retry(ctx, rep.status)
		if l := t.logger(ctx); l != nil {
			logReq(ctx, l, req, "sluice: retrying", slog.Int("attempt", n), slog.Int("status", rep.status),
				slog.Duration("delay", delay), slog.String("reason", why.String()),
				slog.Int("refusals", tr.refusals), errAttr(err))
		}
		waited += delay
		if err := t.cfg.sleep(ctx, delay); err != nil {
			t.ended(ctx, req, n, tr, waited)
			return nil, err
		}
	}
}

// waitError is the error of a bucket's wait that failed with err: the
// caller's own if its context ended, else one that says what to do.
func waitError(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return err
	case errors.Is(err, bucket.ErrExceedsBurst):
		return fmt.Errorf("transport: the request's cost (WithCost) can never be admitted: %w: "+
			"lower the cost (an LLM call's max_tokens) or raise the dimension's burst", err)
	}
	return fmt.Errorf("transport: %w", err)
}

// unsent is RoundTrip's outcome when attempt n of req was not sent (its
// wait failed with err): the last attempt's response, last, which said
// rep, if there is one and the caller is still there; else err.
func (t *Transport) unsent(ctx context.Context, req *http.Request, key string, n int, err error, last *http.Response, rep reply) (*http.Response, error) {
	if n == 1 && req.Body != nil {
		req.Body.Close() // a RoundTripper always closes the body
	}
	if last == nil || ctx.Err() != nil {
		return nil, err
	}
	if l := t.logger(ctx); l != nil {
		logReq(ctx, l, req, "sluice: retry not sent, returning the previous response",
			slog.Int("attempt", n), slog.Int("status", last.StatusCode), errAttr(err))
	}
	return t.metered(ctx, key, rep.charged, rep.epoch, last), nil
}

// drained drains and closes resp, a response not handed back, and returns
// a copy that holds its body in memory, if it was short enough and came
// whole in time (peek.Drain); or nil.
func drained(resp *http.Response) *http.Response {
	if resp == nil {
		return nil
	}
	buf, whole := peek.Drain(resp.Body)
	if !whole {
		return nil
	}
	kept := *resp
	kept.Body = io.NopCloser(bytes.NewReader(buf))
	return &kept
}

// ended records that req is done after attempts sent, with tr, having
// waited that long in all: for the bucket, pauses and in-flight slots
// before its attempts, and between them.
func (t *Transport) ended(ctx context.Context, req *http.Request, attempts int, tr tries, waited time.Duration) {
	t.metrics.request(ctx, attempts, waited)
	if l := t.logger(ctx); l != nil {
		logReq(ctx, l, req, "sluice: request done", slog.Int("attempts", attempts),
			slog.Int("refusals", tr.refusals), slog.Duration("waited", waited))
	}
}

// attempt makes attempt n of req: it waits for key's pause and the bucket,
// asks the breaker (admit), and sends a clone of req through base. sent
// reports whether it got as far as base. err is nil whenever resp is not,
// and then rep is what resp said (read), already acted on (observe). The
// time it waited is added to *waited.
func (t *Transport) attempt(ctx context.Context, req *http.Request, key string, cost bucket.Cost, n int, waited *time.Duration) (resp *http.Response, rep reply, sent bool, err error) {
	a, err := t.admit(ctx, req, key, cost, n, waited)
	if err != nil {
		return nil, rep, false, err
	}
	// The attempt runs in the caller's context: a context of its own would
	// have to live until the body is closed, and costs 3% of throughput.
	r := req.Clone(ctx)
	r.Body = a.body
	resp, err = t.send(r)
	if a.done != nil {
		a.done(outcomeErr(ctx, resp, err))
	}
	if err != nil {
		a.release()
		o := outcomeError
		if ctx.Err() != nil {
			o = outcomeCanceled
		}
		t.metrics.attempt(ctx, o)
		if l := t.logger(ctx); l != nil {
			logReq(ctx, l, req, "sluice: attempt failed", slog.Int("attempt", n),
				slog.Duration("waited", a.waited), errAttr(err))
		}
		return nil, rep, true, err
	}
	if t.cfg.inflight != nil {
		holdSlot(ctx, resp, a.release)
	} // else release is noSlot: nothing to give back, and the body stays as it came
	t.metrics.attempt(ctx, responseOutcome(resp.StatusCode))
	now := t.cfg.now()
	rep = read(resp, now)
	rep.epoch = a.epoch
	t.observe(ctx, key, a.epoch, rep, now)
	rep.charged = t.kept(ctx, key, cost, rep)
	if l := t.logger(ctx); l != nil {
		logReq(ctx, l, req, "sluice: attempt", slog.Int("attempt", n),
			slog.Duration("waited", a.waited), slog.Int("status", resp.StatusCode))
	}
	return resp, rep, true, nil
}

// admission is what an attempt that may be sent is sent with (admit).
type admission struct {
	body    io.ReadCloser // the request body to send: req.Body, or GetBody's for a retry
	epoch   uint64        // of the bucket reservation
	release func()        // gives back the in-flight slot (noSlot if none)
	done    func(error)   // tells the breaker the outcome; nil without a breaker
	waited  time.Duration // for the pause, the slot and the bucket
}

// admit holds attempt n of req back until it may be sent (wait), gets the
// body to send, and asks the breaker. The time it waited is added to
// *waited, admitted or not. An attempt not admitted after its wait gives
// back its slot and its charge.
func (t *Transport) admit(ctx context.Context, req *http.Request, key string, cost bucket.Cost, n int, waited *time.Duration) (a admission, err error) {
	if t.breaker != nil {
		if err := t.breaker.open(); err != nil {
			t.metrics.attempt(ctx, outcomeBreakerOpen)
			return a, err
		}
	}
	start := t.cfg.now()
	a.epoch, a.release, err = t.wait(ctx, key, cost, start)
	a.waited = t.cfg.now().Sub(start)
	*waited += a.waited
	if err != nil {
		t.metrics.attempt(ctx, waitOutcome(ctx, err))
		return a, err
	}
	t.metrics.waited(ctx, a.waited)

	a.body = req.Body
	if n > 1 && a.body != nil && a.body != http.NoBody {
		if a.body, err = req.GetBody(); err != nil {
			t.unadmit(ctx, key, cost, a.release, outcomeError)
			return a, fmt.Errorf("transport: GetBody: %w", err)
		}
	}
	if t.breaker != nil {
		if a.done, err = t.breaker.allow(); err != nil {
			if n > 1 && a.body != nil {
				a.body.Close()
			}
			t.unadmit(ctx, key, cost, a.release, outcomeBreakerOpen)
			return a, err
		}
	}
	return a, nil
}

// unadmit gives back what an attempt that waited and is not sent holds:
// its slot and its charge; o is its outcome.
func (t *Transport) unadmit(ctx context.Context, key string, cost bucket.Cost, release func(), o outcome) {
	release()
	t.refund(ctx, key, cost)
	t.metrics.attempt(ctx, o)
}

// send sends r through base: a response with a nil error, or an error and
// no response, whatever base returns.
func (t *Transport) send(r *http.Request) (*http.Response, error) {
	t.ledger.sent.Add(1)
	resp, err := t.base.RoundTrip(r)
	if err != nil && resp != nil { // a broken base: err wins
		if resp.Body != nil {
			resp.Body.Close()
		}
		resp = nil
	}
	if err == nil && resp == nil {
		err = errors.New("transport: base RoundTripper returned no response and no error")
	}
	return resp, err
}

// wait holds the attempt back until key's pause is over, it has an
// in-flight slot of key (WithInFlight), and the bucket has its cost, within
// the max wait and ctx's deadline. It returns the epoch of the reservation,
// and the slot's release (noSlot if it takes none).
//
// A slot that comes due while this process knows the key to be paused
// (a 429 came back while the slot was waited for) is dropped, and another
// reserved once the pause is over. The bucket, paused for the fleet,
// lets the slots reserved before the pause come due during it and
// schedules what is reserved later from its end, at the rate; held to the
// end, this process's slots would go out as a herd into a provider that has
// refilled only its burst, and held by the pause's length they would
// collide with the slots reserved after it.
func (t *Transport) wait(ctx context.Context, key string, cost bucket.Cost, now time.Time) (uint64, func(), error) {
	maxWait := t.cfg.maxWait
	var release func()
	fail := func(err error) (uint64, func(), error) {
		if release != nil {
			release()
		}
		return 0, nil, err
	}
	for {
		d, err := t.paused(ctx, key, now, maxWait)
		if err != nil {
			return fail(err)
		}
		if maxWait != bucket.Unlimited {
			maxWait -= d
		}
		if release == nil {
			release = noSlot
			if t.cfg.inflight != nil {
				var waited time.Duration
				if release, waited, err = t.slot(ctx, key, maxWait); err != nil {
					release = nil
					return fail(err)
				}
				if maxWait != bucket.Unlimited {
					maxWait -= waited
				}
			}
		}
		if t.cfg.bucket == nil {
			return 0, release, nil
		}
		r, err := bucket.WaitMax(ctx, t.cfg.bucket, key, cost, maxWait)
		if err != nil {
			return fail(waitError(ctx, err))
		}
		t.ledger.add(charged, cost)
		if maxWait != bucket.Unlimited {
			maxWait -= r.Delay
		}
		if r.Delay <= 0 {
			return r.Epoch, release, nil
		}
		if now = t.cfg.now(); t.pauses.until(key, now).IsZero() {
			return r.Epoch, release, nil
		}
		// Not refunded: a token bucket counts the slots due during the
		// pause as spent, and a refund would hand out one of the slots due
		// after it a second time; a window bucket, which knows no pause,
		// counts the dropped slot too, but its refund would free the newest
		// reservation, still to be sent, not this one (see
		// bucket.FixedWindow.Observe). Either way the slot is charged, which
		// errs toward the limit.
	}
}

// paused sleeps until key's pause in this process is over, if it is paused,
// and says how long it slept. A pause longer than maxWait or ctx's deadline
// allow fails at once with a *bucket.WaitError.
func (t *Transport) paused(ctx context.Context, key string, now time.Time, maxWait time.Duration) (time.Duration, error) {
	until := t.pauses.until(key, now)
	if until.IsZero() {
		return 0, nil
	}
	d := until.Sub(now)
	allowed := maxWait
	if dl, ok := ctx.Deadline(); ok {
		allowed = max(min(allowed, dl.Sub(now)), 0)
	}
	if d > allowed {
		return 0, fmt.Errorf("transport: key paused by Retry-After: %w",
			&bucket.WaitError{RetryAfter: d, MaxWait: allowed})
	}
	return d, t.cfg.sleep(ctx, d)
}

func waitOutcome(ctx context.Context, err error) outcome {
	switch {
	case errors.Is(err, bucket.ErrDeadline):
		return outcomeWaitExceeded
	case ctx.Err() != nil:
		return outcomeCanceled
	}
	return outcomeBucketError
}

// refund gives back cost, charged to key by an attempt whose slot came:
// all of it for one that waited but was not sent, a part for a refusal
// (kept). It reports whether the bucket took the refund.
func (t *Transport) refund(ctx context.Context, key string, cost bucket.Cost) bool {
	if t.cfg.bucket == nil {
		return false
	}
	rctx, cancel := wait.Detached(ctx)
	defer cancel()
	if err := bucket.Settle(rctx, t.cfg.bucket, key, cost.Neg()); err != nil {
		t.debugKey(ctx, "sluice: refund failed", errAttr(err))
		return false
	}
	t.ledger.add(refunded, cost)
	return true
}

// kept returns what an attempt that was charged cost and got rep keeps of
// that charge, having given the rest back to key. A refusal that waiting
// cures (reply.refusal: a 429 that is no spent quota, a 503 or 529 that
// asks for a delay) keeps its request, which a provider may count (OpenAI
// counts refused requests toward its limit), and gives back every other
// dimension, its tokens: the provider served nothing, and counts none;
// kept, they would be counted twice, once more by the retry. But a
// dimension whose remaining the refusal reports stays charged: Observe has
// just brought the bucket to what the provider says is left, which
// already lacks this attempt. The refund comes after Observe, so that a
// pause it set keeps the bucket empty at its end (a refund while paused
// moves no slot into the pause). Every other response keeps its whole
// charge, to be reconciled with its usage (WithUsage). A refund the bucket
// fails to take leaves the charge as it was.
func (t *Transport) kept(ctx context.Context, key string, cost bucket.Cost, rep reply) bucket.Cost {
	if t.cfg.bucket == nil || !rep.refusal() {
		return cost
	}
	keep, back := bucket.Cost{}, bucket.Cost{}
	for dim, v := range cost {
		if q, ok := rep.fb.Quotas[dim]; dim == bucket.Requests || ok && q.Remaining >= 0 || v <= 0 {
			keep[dim] = v
		} else {
			back[dim] = v
		}
	}
	if len(back) == 0 || !t.refund(ctx, key, back) {
		return cost
	}
	return keep
}

// reply is what a response said, read once (read): everything the
// Transport does about a response, it decides from its reply.
type reply struct {
	status int
	// fb is what the response says about the limit (adaptive.Parse); for a
	// refusal for rate or load (fb.Class is not Accepted: a 429, 503 or
	// 529, or a 403 that GitHub's headers say is one), amended by what the
	// start of its body says (peek.Response, adaptive.ParseBody): a spent
	// quota, a delay.
	fb adaptive.Feedback
	// after is the delay the response asks for before this request is
	// tried again, if it asks (asked): a refusal's fb.RetryAfter; for any
	// other status of 400 or more, its Retry-After (adaptive.RetryAfter).
	after time.Duration
	asked bool
	// unread is set when a refusal's body could not be read (unreadBody),
	// so that what it says is not known.
	unread bool
	// shouldRetry is what an x-should-retry header on a status of 400 or
	// more says: a retry or none, whatever the status.
	shouldRetry verdict
	// epoch is that of the attempt's reservation, for what its body says
	// later (see FeedbackMeter).
	epoch uint64
	// charged is what the attempt keeps of its charge (see kept), for its
	// reconciliation with the usage its body reports (see WithUsage).
	charged bucket.Cost
}

// refusal reports whether r is a refusal for rate or load that waiting
// cures: a rate limit (not a spent quota), or an overload that asks for a
// delay. A rate limit whose body could not be read (unread), and that
// neither asks for a delay nor reports its quota, may be a spent quota:
// it is no such refusal.
func (r reply) refusal() bool {
	switch r.fb.Class {
	case adaptive.RateLimited:
		return !r.unread || r.asked || len(r.fb.Quotas) > 0
	case adaptive.Overloaded:
		return r.asked
	}
	return false
}

// unreadBody reports whether the body of resp, of which peek read head,
// could not be read whole as text: it came too late (head is nil), it is
// longer than peek reads, or it is compressed (a caller that sets
// Accept-Encoding itself gets it so).
func unreadBody(resp *http.Response, head []byte) bool {
	ce := resp.Header.Get("Content-Encoding")
	return head == nil || len(head) >= peek.Max || ce != "" && !strings.EqualFold(ce, "identity")
}

// verdict is a header's say on a retry.
type verdict uint8

const (
	noVerdict verdict = iota
	retryYes
	retryNo
)

// read reads resp once into a reply, at time now. Only a refusal's body is
// looked into, at most peek.Max bytes for at most peek.Timeout, and
// handed back to the caller unread.
func read(resp *http.Response, now time.Time) reply {
	r := reply{status: resp.StatusCode, fb: adaptive.Parse(resp.StatusCode, resp.Header, now)}
	if resp.StatusCode < http.StatusBadRequest {
		return r
	}
	if r.fb.Class != adaptive.Accepted {
		hasBody := resp.Body != nil && resp.Body != http.NoBody
		head := peek.Response(resp)
		r.unread = hasBody && unreadBody(resp, head)
		r.fb = r.fb.WithBody(adaptive.ParseBody(head))
		r.after, r.asked = r.fb.RetryAfter, r.fb.HasRetryAfter
	} else {
		r.after, r.asked = adaptive.RetryAfter(resp.Header, now)
	}
	switch resp.Header.Get("X-Should-Retry") {
	case "true":
		r.shouldRetry = retryYes
	case "false":
		r.shouldRetry = retryNo
	}
	return r
}

// observe acts on what rep says about the limit, at time now. A refusal
// that asks for a delay (a Retry-After, or one its body states) holds key
// back in this process for that long (at most MaxRetryAfter), slots
// already reserved included (see wait); and the bucket learns it all for
// the fleet (bucket.Observe): every refusal, and what accepted responses
// report about the quota, at most once per observeEvery per key.
func (t *Transport) observe(ctx context.Context, key string, epoch uint64, rep reply, now time.Time) {
	fb := rep.fb
	if fb.Empty() {
		return
	}
	fb.Epoch = epoch
	// Parse reads a Retry-After from a refusal only: nothing else pauses
	// the key.
	fb.RetryAfter = min(fb.RetryAfter, t.cfg.retry.MaxRetryAfter)
	if fb.RetryAfter > 0 {
		t.pauses.pause(key, now.Add(fb.RetryAfter), now)
	}
	if t.cfg.bucket == nil || fb.Class == adaptive.Accepted && !t.sampler.due(key, now) {
		return
	}
	octx, cancel := wait.Detached(ctx)
	defer cancel()
	if err := t.cfg.bucket.Observe(octx, key, fb); err != nil {
		t.debugKey(ctx, "sluice: observe failed", errAttr(err))
	}
}

// breakerChanged records and logs a state change of the breaker.
func (t *Transport) breakerChanged(name string, from, to gobreaker.State) {
	t.metrics.breakerState(name, to)
	t.debugKey(context.Background(), "sluice: circuit breaker state changed",
		slog.String("breaker", name), slog.String("from", from.String()), slog.String("to", to.String()))
}

// logger returns the logger to use if debug logs are enabled, or nil.
func (t *Transport) logger(ctx context.Context) *slog.Logger {
	l := t.cfg.logger
	if l == nil {
		l = slog.Default()
	}
	if !l.Enabled(ctx, slog.LevelDebug) {
		return nil
	}
	return l
}

// logReq logs msg about req at debug level: its method and URL without
// query or user info, never a header. Callers check t.logger first, so that
// nothing is built for a log line that is not wanted.
func logReq(ctx context.Context, l *slog.Logger, req *http.Request, msg string, attrs ...slog.Attr) {
	attrs = append(attrs, slog.String("method", req.Method), slog.String("url", redact(req.URL)))
	l.LogAttrs(ctx, slog.LevelDebug, msg, attrs...)
}

func (t *Transport) debugKey(ctx context.Context, msg string, attrs ...slog.Attr) {
	if l := t.logger(ctx); l != nil {
		l.LogAttrs(ctx, slog.LevelDebug, msg, attrs...)
	}
}

// redact returns u without user info, query or fragment.
func redact(u *url.URL) string {
	if u == nil {
		return ""
	}
	return u.Scheme + "://" + u.Host + u.EscapedPath()
}

// errAttr is err for a log line; a *url.Error is reduced to its cause, since
// its URL may carry a query.
func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.Attr{}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return slog.String("err", err.Error())
}
