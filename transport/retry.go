package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/wait"
)

// Retry says which attempts are tried again, and after how long. The zero
// value is the default policy. An attempt is retried, up to MaxAttempts
// (refusals apart: see MaxRefusals), when its request body can be replayed
// (no body, or GetBody is set) and:
//
//   - the response is 429, 503 or 529, or a 403 that says it is a rate
//     limit (GitHub's: X-RateLimit-Remaining 0, or a Retry-After; see
//     adaptive.Parse): the upstream turned the request away before
//     processing it, so any method is retried; except a 429 whose body says
//     the quota is exhausted (OpenAI's "insufficient_quota", a Gemini daily
//     quota; see adaptive.ParseBody), which waiting will not fix: its first
//     4 KiB, if they come within 250ms (a body slower than that is taken to
//     say nothing);
//   - the response is 408, 500, 502 or 504, or the attempt failed without a
//     response (a connection error; not a cancelled context, nor a
//     certificate error), and the request is idempotent: GET, HEAD,
//     OPTIONS, TRACE, PUT or DELETE, or one that carries an Idempotency-Key
//     (or X-Idempotency-Key) header; with NonIdempotent, any request;
//   - never for 501 nor any other status;
//   - but a response header "x-should-retry: true" or "false" decides for
//     any status of 400 and above, but a spent quota, never retried.
//
// The wait before a retry is the delay the response asks for, in
// retry-after-ms or Retry-After (seconds or an HTTP-date); or, for a
// refusal whose headers ask for none, in its body (Gemini's RetryInfo, a
// "try again in 6.379s" in the message) or until the reset of its spent
// X-RateLimit quota (GitHub); or else the next exponential backoff interval; a random extra of up to Jitter times that
// delay is added, never taken off. A response that asks for more than
// MaxRetryAfter is returned as it is, and so is one whose retry would start
// after the request context's deadline.
type Retry struct {
	// MaxAttempts is the most attempts made for one request, the first
	// included, not counting those refused for rate or load when the
	// Transport has a bucket (see MaxRefusals); 1 disables retries, those
	// after refusals included. Zero means 3.
	MaxAttempts int
	// MaxRefusals is, when the Transport has a bucket (WithBucket), the
	// most retries of one request after refusals for rate or load that
	// waiting cures: a 429 (not a spent quota, nor one whose body could
	// not be read and that names no delay nor quota: that may be a spent
	// quota), or a 503 or 529 that asks for a delay (a Retry-After, or one
	// its body states). Such a retry waits on the bucket, which has just
	// learnt from the refusal, like any attempt: it is sent once the
	// fleet's rate and pause allow, as long as the request's context
	// allows that wait and the request has not waited longer than
	// WithMaxWait in all (its attempts' waits and the delays before its
	// retries); and it is not counted against MaxAttempts. MaxRefusals bounds the retries
	// when nothing else does (no deadline, no max wait): an upstream that
	// refuses everything, even with Retry-After: 0, gets at most
	// MaxRefusals+1 attempts of a request, each paced by the bucket. Zero
	// means 20. Without a bucket, refusals count against MaxAttempts.
	MaxRefusals int
	// InitialInterval, Multiplier and MaxInterval shape the backoff used
	// when a response names no delay (backoff/v4's ExponentialBackOff,
	// without its randomization): the n-th retry waits
	// InitialInterval·Multiplier^(n-1), at most MaxInterval, before jitter.
	// Zero means 500ms, 2 and 8s.
	InitialInterval time.Duration
	Multiplier      float64
	MaxInterval     time.Duration
	// Jitter is the largest random extra added to a delay, as a fraction of
	// it. Zero means 0.2; negative means none.
	Jitter float64
	// MaxRetryAfter is the longest Retry-After honoured, and the longest a
	// 429 or 503 holds back the other requests of its key. Zero means 60s.
	MaxRetryAfter time.Duration
	// NonIdempotent retries 408, 500, 502, 504 and connection errors for
	// every request, not only idempotent ones.
	NonIdempotent bool
}

// Default values of Retry's fields.
const (
	defaultMaxAttempts     = 3
	defaultMaxRefusals     = 20
	defaultInitialInterval = 500 * time.Millisecond
	defaultMultiplier      = 2
	defaultMaxInterval     = 8 * time.Second
	defaultJitter          = 0.2
	defaultMaxRetryAfter   = 60 * time.Second
)

// validate panics on a policy no program means to set.
func (r Retry) validate() {
	bad := func(field string, v any) {
		panic(fmt.Sprintf("transport: invalid Retry.%s %v", field, v))
	}
	switch {
	case r.MaxAttempts < 0:
		bad("MaxAttempts", r.MaxAttempts)
	case r.MaxRefusals < 0:
		bad("MaxRefusals", r.MaxRefusals)
	case r.InitialInterval < 0:
		bad("InitialInterval", r.InitialInterval)
	case r.MaxInterval < 0:
		bad("MaxInterval", r.MaxInterval)
	case r.MaxRetryAfter < 0:
		bad("MaxRetryAfter", r.MaxRetryAfter)
	case math.IsNaN(r.Multiplier) || math.IsInf(r.Multiplier, 0) || r.Multiplier < 0 || (r.Multiplier > 0 && r.Multiplier < 1):
		bad("Multiplier", r.Multiplier)
	case math.IsNaN(r.Jitter) || math.IsInf(r.Jitter, 0):
		bad("Jitter", r.Jitter)
	}
}

// withDefaults returns r with zero fields set to their defaults, and Jitter
// the fraction actually used.
func (r Retry) withDefaults() Retry {
	if r.MaxAttempts == 0 {
		r.MaxAttempts = defaultMaxAttempts
	}
	if r.MaxRefusals == 0 {
		r.MaxRefusals = defaultMaxRefusals
	}
	if r.InitialInterval == 0 {
		r.InitialInterval = defaultInitialInterval
	}
	if r.Multiplier == 0 {
		r.Multiplier = defaultMultiplier
	}
	if r.MaxInterval == 0 {
		r.MaxInterval = defaultMaxInterval
	}
	switch {
	case r.Jitter == 0:
		r.Jitter = defaultJitter
	case r.Jitter < 0:
		r.Jitter = 0
	}
	if r.MaxRetryAfter == 0 {
		r.MaxRetryAfter = defaultMaxRetryAfter
	}
	return r
}

// reason is why decide retries an attempt, or why it does not.
type reason uint8

const (
	retryAsked   reason = iota // after the delay the response asked for
	retryBackoff               // after the next backoff interval
	// The attempt is final: a success, a status or an error not retried,
	// the last attempt, a body that cannot be replayed, a request that is
	// not idempotent, or an x-should-retry: false.
	final
	finalQuota      // the quota is exhausted: no wait will cure it
	finalRetryAfter // the response asks for more than MaxRetryAfter
	finalDeadline   // the retry would start after the context's deadline
	finalRefusals   // refused MaxRefusals times already
	finalMaxWait    // the retry of a refusal would wait past WithMaxWait, with what the request waited before
)

// retry reports whether the attempt is retried.
func (w reason) retry() bool { return w < final }

// logged reports whether the reason to return a failed response is worth
// a log line: one the caller may not expect from the response alone.
func (w reason) logged() bool { return w > final }

func (w reason) String() string {
	switch w {
	case retryAsked:
		return "after the delay asked"
	case retryBackoff:
		return "after a backoff"
	case final:
		return "final"
	case finalQuota:
		return "quota exhausted"
	case finalRetryAfter:
		return "Retry-After too long"
	case finalDeadline:
		return "the retry would pass the deadline"
	case finalRefusals:
		return "refused MaxRefusals times"
	case finalMaxWait:
		return "the retry would wait past the max wait"
	}
	return "reason(" + strconv.Itoa(int(w)) + ")"
}

// tries is what the earlier attempts of one request came to.
type tries struct {
	// backoffs counts the retries made after a backoff interval.
	backoffs int
	// refusals counts the retries made after refusals through the bucket
	// (see Retry.MaxRefusals): they are not counted against MaxAttempts.
	refusals int
}

// after returns tr once a retry is made, for reason why, of an attempt
// that was refused, or not (see Retry.refused).
func (tr tries) after(why reason, refused bool) tries {
	if why == retryBackoff {
		tr.backoffs++
	}
	if refused {
		tr.refusals++
	}
	return tr
}

// refused reports whether an attempt that ended with rep or err is a
// refusal that is retried through the bucket (bucketed: the Transport has
// one), apart from MaxAttempts (see MaxRefusals).
func (r *Retry) refused(rep reply, err error, bucketed bool) bool {
	return bucketed && err == nil && rep.refusal() && r.MaxAttempts > 1
}

// decide says whether attempt n of req, which ended with rep or err, is
// retried, and after how long: the delay rep asks for, or else the next
// backoff interval (after the earlier attempts' tr), plus jitter drawn from
// u, uniform in [0, 1); now is the time, for ctx's deadline. bucketed says
// the Transport has a bucket, through which a refusal is retried (see
// Retry.MaxRefusals). It is a function of its arguments: it logs nothing,
// and changes nothing. For a final reason the delay is the one the retry
// would have waited, if any.
func (r *Retry) decide(ctx context.Context, req *http.Request, n int, rep reply, err error, tr tries, bucketed bool, now time.Time, u float64) (time.Duration, reason) {
	refusal := r.refused(rep, err, bucketed)
	switch {
	case !replayable(req):
		return 0, final
	case refusal && tr.refusals >= r.MaxRefusals:
		return 0, finalRefusals
	case !refusal && n-tr.refusals >= r.MaxAttempts:
		return 0, final
	}
	if err != nil {
		if !retryableError(ctx, err) || !(r.NonIdempotent || idempotent(req)) {
			return 0, final
		}
	} else if ok, why := r.retryable(req, rep); !ok {
		return 0, why
	}
	d, why := rep.after, retryAsked
	switch {
	case !rep.asked:
		d, why = r.backoff(tr.backoffs+1), retryBackoff
	case d > r.MaxRetryAfter:
		return d, finalRetryAfter
	}
	d = r.jitter(d, u)
	if dl, ok := ctx.Deadline(); ok && now.Add(d).After(dl) {
		return d, finalDeadline
	}
	return d, why
}

// retryable reports whether the response rep describes may be retried,
// by its status and headers (see Retry), and if not, why not.
func (r *Retry) retryable(req *http.Request, rep reply) (ok bool, why reason) {
	switch {
	case rep.status < http.StatusBadRequest || rep.shouldRetry == retryNo:
		return false, final
	case rep.fb.Class == adaptive.QuotaExhausted:
		return false, finalQuota
	case rep.shouldRetry == retryYes:
		return true, 0
	case rep.fb.Class != adaptive.Accepted:
		// Turned away for rate or load before it was processed: any
		// method may go again.
		return true, 0
	}
	switch rep.status {
	case http.StatusRequestTimeout, http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout:
		if r.NonIdempotent || idempotent(req) {
			return true, 0
		}
	}
	return false, final
}

// backoff returns the k-th backoff interval (k >= 1):
// InitialInterval·Multiplier^(k-1), at most MaxInterval. It is what the
// k-th NextBackOff of a fresh backoff/v4 ExponentialBackOff without
// randomization returns (jitter adds the randomness, upward only): a fresh
// one, replayed, keeps this a function of k, and the ExponentialBackOff
// (not safe for concurrent use) never shared.
func (r *Retry) backoff(k int) time.Duration {
	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(r.InitialInterval),
		backoff.WithRandomizationFactor(0),
		backoff.WithMultiplier(r.Multiplier),
		backoff.WithMaxInterval(r.MaxInterval),
		backoff.WithMaxElapsedTime(0),
	)
	var d time.Duration
	for range k {
		d = bo.NextBackOff()
	}
	return min(d, r.MaxInterval)
}

// idempotent reports whether req may be sent twice with no harm.
func idempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	_, ok := req.Header["Idempotency-Key"]
	if !ok {
		_, ok = req.Header["X-Idempotency-Key"]
	}
	return ok
}

// replayable reports whether req's body can be sent again.
func replayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// retryableError reports whether an attempt that failed with err, and no
// response, failed for a reason a new connection may not have: not a
// cancelled context, a certificate that does not verify, nor an HTTPS
// request to an HTTP server.
func retryableError(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, http.ErrSchemeMismatch) {
		return false
	}
	var (
		verr  *tls.CertificateVerificationError
		uaerr x509.UnknownAuthorityError
		herr  x509.HostnameError
		cierr x509.CertificateInvalidError
	)
	return !errors.As(err, &verr) && !errors.As(err, &uaerr) && !errors.As(err, &herr) && !errors.As(err, &cierr)
}

// jitter adds to d a random extra of up to r.Jitter·d; u is uniform in [0, 1).
func (r *Retry) jitter(d time.Duration, u float64) time.Duration {
	if r.Jitter <= 0 || d <= 0 {
		return d
	}
	return wait.Add(d, wait.Seconds(d.Seconds()*r.Jitter*u))
}
