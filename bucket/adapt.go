package bucket

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/wait"
)

// adaptation is a token bucket's adaptive law with the times it scales to
// the limit's window: the longest Burst/Rate among the dimensions (not
// counting their longer windows, WithWindow).
//
// What a response teaches a key is hostile input (a lying upstream, a
// proxy's bug) and is bounded before it reaches the key's state: a pause
// lasts at most span; a reported quota whose reset or window is longer
// than maxReported is ignored, remaining and all; a reported limit counts
// only if it is at least minReported, and its rate and burst are floored at
// Policy.Floor of the configured ones (and kept within what a Limit may
// be); it holds until its reset (at least
// one window of the limit), at most span. Every cut recovers within span
// too, so span is the horizon within which a key forgets all it learnt.
type adaptation struct {
	policy   adaptive.Policy
	limit    time.Duration // the limit's window
	window   time.Duration // refusals are counted within one: ThresholdWindows of the limit's
	span     time.Duration // a full recovery: RecoveryWindows windows; the horizon of all that is learnt
	minEpoch time.Duration // the least time between two decreases
	hold     time.Duration // how long a decreased rate must be kept to be known safe
}

// maxReported is the longest reset or window a reported quota may state to
// be believed: a day, the longest window providers publish.
const maxReported = 24 * time.Hour

// minReported is the least limit a reported quota may state to be
// believed: one request, or one token.
const minReported = 1

func newAdaptation(p adaptive.Policy, dims []dim) adaptation {
	var window float64 // seconds
	for _, d := range dims {
		if !d.window() { // a window takes no part in the law
			window = max(window, d.limit.Burst/d.limit.Rate)
		}
	}
	return adaptation{
		policy:   p,
		limit:    wait.Seconds(window),
		window:   max(wait.Seconds(window*p.ThresholdWindows), time.Microsecond),
		span:     max(wait.Seconds(window*p.RecoveryWindows), time.Microsecond),
		minEpoch: wait.Seconds(window * p.MinEpoch), // none if negative
		hold:     wait.Seconds(window * p.HoldWindows),
	}
}

// held returns after, the fraction a key's last decrease, at decreased,
// cut it to, if the key has kept it for the hold time by now; 0 if not, or
// if there was none.
func (a *adaptation) held(after float64, decreased, now time.Time) float64 {
	if decreased.IsZero() || now.Sub(decreased) < a.hold {
		return 0
	}
	return after
}

// report is what a response reported of one dimension's quota, bounded:
// rem < 0, rate and burst 0 are unknown, until is when the rate and burst
// stop counting.
type report struct {
	rem, rate, burst float64
	until            time.Duration // from now
}

// says reports whether r says anything: a remaining, a rate or a burst.
func (r report) says() bool { return r.rem >= 0 || r.rate > 0 || r.burst > 0 }

// report bounds q, reported for a dimension limited to l.
func (a *adaptation) report(q adaptive.Quota, l Limit) report {
	r := report{rem: -1}
	if q.Reset > maxReported || q.Window > maxReported {
		return r // a lie, remaining and all
	}
	if q.Remaining >= 0 && !math.IsInf(q.Remaining, 0) {
		r.rem = q.Remaining
	}
	if !(q.Limit >= minReported) || math.IsInf(q.Limit, 0) {
		return r
	}
	if v, ok := q.Rate(); ok {
		r.rate = min(max(v, a.policy.Floor*l.Rate, minRate), maxRate)
	}
	r.burst = min(max(q.Limit, a.policy.Floor*l.Burst, minBurst), maxBurst)
	r.until = min(max(q.Reset, q.Window, a.limit), a.span)
	return r
}

// pause returns how long fb pauses a key, bounded: at most span; reported
// says whether the key believed a quota fb reported (see report.says). A
// refusal pauses it for as long as it asks (a Retry-After, or a delay its
// body states). A refusal for rate (a 429) that asks for no wait and reports
// no quota the key believes pauses it for one window of the limit, at most
// maxUnasked: what a limiter that counts over its window, refusals included
// (a proxy's sliding window, as haproxy's http_req_rate), needs to forget
// the excess, where the fleet's retries after a backoff would keep its
// count full. Anything else pauses nothing.
func (a *adaptation) pause(fb adaptive.Feedback, reported bool) time.Duration {
	switch {
	case fb.Class == adaptive.Accepted:
		return 0
	case fb.HasRetryAfter || fb.RetryAfter > 0:
		return min(max(fb.RetryAfter, 0), a.span)
	case fb.Class == adaptive.RateLimited && !reported:
		return min(a.limit, maxUnasked, a.span)
	}
	return 0
}

// maxUnasked is the longest pause of a refusal that asks for no wait.
const maxUnasked = time.Second

// counts reports whether fb is a refusal that counts toward a decrease of
// a key at epoch: rate limited, for a request reserved since the last
// decrease.
func (a *adaptation) counts(fb adaptive.Feedback, epoch uint64) bool {
	return fb.Class == adaptive.RateLimited && fb.Epoch >= epoch
}

// flags is the law as the scripts read it (argFlags): flagAdditive for
// the additive Recovery law (else cubic), flagCold for a cold start.
func (a *adaptation) flags() any {
	n := 0
	if a.policy.Recovery == adaptive.Additive {
		n |= flagAdditive
	}
	if a.policy.ColdStart {
		n |= flagCold
	}
	return smallAmounts[n]
}

// flagsCold is flags with a cold start.
func (a *adaptation) flagsCold() any {
	if a.policy.Recovery == adaptive.Additive {
		return smallAmounts[flagAdditive|flagCold]
	}
	return smallAmounts[flagCold]
}

// pauseTokens returns what a dimension holds at the end of a pause of d
// that began with tokens at rate: nothing, or the debt of the slots
// reserved before the pause that are due after it. The slots due during the
// pause keep their times: a process that knows of the pause reserves them
// again after it, and one that does not sends them; were the debt shifted
// past the pause instead, what is reserved after it would wait behind slots
// that have gone, and the fleet would send at a fraction of the rate.
func pauseTokens(tokens float64, d time.Duration, rate float64) float64 {
	return min(0, tokens+d.Seconds()*rate)
}
