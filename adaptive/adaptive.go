// Package adaptive reads what an API's responses say about its rate limits
// (Feedback) and holds the parameters of the law by which a bucket adapts
// its rate to them (Policy). It makes no network calls: the bucket package
// applies a Feedback to the shared state, atomically, fleet-wide.
package adaptive

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Class is what a response says about the request's admission.
type Class uint8

const (
	// Accepted: the response is not a refusal (it may still carry quota
	// headers).
	Accepted Class = iota
	// RateLimited: too many requests or tokens (429): slow down, retry later.
	RateLimited
	// QuotaExhausted: the account is out of credit or over a hard budget
	// (429 with insufficient_quota, billing errors): retrying will not help
	// and slowing down is pointless.
	QuotaExhausted
	// Overloaded: the provider is overloaded (503, 529) whatever our rate.
	Overloaded
)

func (c Class) String() string {
	switch c {
	case Accepted:
		return "accepted"
	case RateLimited:
		return "rate_limited"
	case QuotaExhausted:
		return "quota_exhausted"
	case Overloaded:
		return "overloaded"
	}
	return fmt.Sprintf("Class(%d)", uint8(c))
}

// Quota is what a provider reports about one dimension of its limit.
// A zero field is unknown, except Remaining, which is unknown when negative.
type Quota struct {
	// Limit is the most the provider admits in one window (its burst).
	Limit float64
	// Remaining is what the provider would admit right now; negative if
	// unknown.
	Remaining float64
	// Reset is how long until the quota is whole again (Limit remaining).
	Reset time.Duration
	// Window is the length of the window Limit applies to, when the provider
	// states it (the IETF RateLimit-Policy's w parameter).
	Window time.Duration
}

// Rate returns the refill rate, per second, that q implies, and false if it
// implies none: Limit per Window when the window is stated, else, read as a
// token bucket (what OpenAI's and Anthropic's resets describe), what is
// missing divided by the time it takes to come back.
func (q Quota) Rate() (float64, bool) {
	if !(q.Limit > 0) || math.IsInf(q.Limit, 0) {
		return 0, false
	}
	if q.Window > 0 {
		return q.Limit / q.Window.Seconds(), true
	}
	if q.Remaining >= 0 && q.Remaining < q.Limit && q.Reset > 0 {
		return (q.Limit - q.Remaining) / q.Reset.Seconds(), true
	}
	return 0, false
}

// Dimension names of the quotas a Feedback reports; they match the bucket
// package's Requests and Tokens. Anthropic also reports input and output
// tokens apart.
const (
	Requests     = "requests"
	Tokens       = "tokens"
	InputTokens  = "input_tokens"
	OutputTokens = "output_tokens"
)

// Feedback is what one response tells about the limit it met.
type Feedback struct {
	// Class is the response's verdict on the request.
	Class Class
	// RetryAfter is how long the provider asked to wait (Retry-After,
	// retry-after-ms), zero if it did not.
	RetryAfter time.Duration
	// Quotas holds what the provider reported, by dimension.
	Quotas map[string]Quota
	// Epoch is the bucket epoch the request was reserved in
	// (bucket.Reservation.Epoch); the reader leaves it zero and the caller
	// sets it. A refusal counts toward a rate decrease only if no decrease
	// has happened since the request was reserved.
	Epoch uint64
}

// Throttled reports whether the response refused the request for rate or
// load: what slows a bucket down.
func (f Feedback) Throttled() bool { return f.Class == RateLimited || f.Class == Overloaded }

// Empty reports whether f tells a bucket nothing: an accepted response that
// reports no quota and asks for no pause.
func (f Feedback) Empty() bool {
	return f.Class == Accepted && f.RetryAfter <= 0 && len(f.Quotas) == 0
}

// Recovery is the law by which a rate climbs back after a decrease.
type Recovery uint8

const (
	// Cubic climbs fast at first, levels off near the rate that was too
	// high, then probes beyond it ever faster (as TCP CUBIC does): it spends
	// its time close to the limit.
	Cubic Recovery = iota
	// Additive climbs at a constant slope.
	Additive
)

func (r Recovery) String() string {
	switch r {
	case Cubic:
		return "cubic"
	case Additive:
		return "additive"
	}
	return fmt.Sprintf("Recovery(%d)", uint8(r))
}

// Policy is the law a bucket follows when its responses are throttled.
// Rates are handled as fractions of the configured limit (the ceiling): a
// throttled response multiplies the fraction by Decrease, at most once per
// epoch once Threshold refusals came within a window, and it then recovers toward 1 as the Recovery law says, over a
// time scaled to the limit's window (Burst/Rate), so that a per-minute limit
// recovers over minutes and a per-second one over seconds. The zero Policy
// is DefaultPolicy.
type Policy struct {
	// Decrease multiplies the rate on a decrease, in (0, 1). Default 0.5.
	Decrease float64
	// Threshold is how many refusals within one window of the limit make a
	// decrease: one 429 now and then at the exact limit is noise, not a
	// reason to halve. Default 3.
	Threshold int
	// Floor is the lowest fraction of the ceiling the rate falls to, in
	// (0, 1]. Default 0.02.
	Floor float64
	// Recovery is the law of the climb back. Default Cubic.
	Recovery Recovery
	// RecoveryWindows is the time scale of a recovery, in windows of the
	// limit: a rate decreased from the ceiling climbs back to it in that
	// long, slowly at first; one decreased from below the ceiling is back
	// where it was in a sixth of it (Cubic), then probes beyond as slowly.
	// Default 60: a 20/s limit (window 1 s) halved from the ceiling is back
	// in 60 s, but past 110% of the halved rate only after 25 s; a limit
	// per minute takes as many minutes. Larger is fewer 429s, smaller is a
	// faster return when the provider raises its limit.
	RecoveryWindows float64
	// MinEpoch is the least time between two decreases, in windows of the
	// limit: a decrease takes that long to show in the provider's counters.
	// Default 1.
	MinEpoch float64
}

// returnTime is when, as a fraction of the recovery span, a Cubic recovery
// is back at the level it decreased from.
const returnTime = 1.0 / 6

// DefaultPolicy returns the policy a bucket follows unless told otherwise.
func DefaultPolicy() Policy {
	return Policy{Decrease: 0.5, Threshold: 3, Floor: 0.02, Recovery: Cubic, RecoveryWindows: 60, MinEpoch: 1}
}

// ErrInvalidPolicy is matched by errors from Policy.Validate.
var ErrInvalidPolicy = errors.New("adaptive: invalid policy")

// WithDefaults returns p with its zero fields set to DefaultPolicy's.
func (p Policy) WithDefaults() Policy {
	d := DefaultPolicy()
	if p.Decrease == 0 {
		p.Decrease = d.Decrease
	}
	if p.Threshold == 0 {
		p.Threshold = d.Threshold
	}
	if p.Floor == 0 {
		p.Floor = d.Floor
	}
	if p.RecoveryWindows == 0 {
		p.RecoveryWindows = d.RecoveryWindows
	}
	if p.MinEpoch == 0 {
		p.MinEpoch = d.MinEpoch
	}
	return p
}

// Validate reports whether p, with defaults applied, is usable; the error
// wraps ErrInvalidPolicy.
func (p Policy) Validate() error {
	p = p.WithDefaults()
	bad := func(field string, v float64) error {
		return fmt.Errorf("%w: %s is %v", ErrInvalidPolicy, field, v)
	}
	switch {
	case !(p.Decrease > 0 && p.Decrease < 1):
		return bad("Decrease (want 0 < d < 1)", p.Decrease)
	case p.Threshold < 1:
		return bad("Threshold (want >= 1)", float64(p.Threshold))
	case !(p.Floor > 0 && p.Floor <= 1):
		return bad("Floor (want 0 < f <= 1)", p.Floor)
	case !(p.RecoveryWindows > 0) || math.IsInf(p.RecoveryWindows, 0):
		return bad("RecoveryWindows (want > 0)", p.RecoveryWindows)
	case !(p.MinEpoch >= 0) || math.IsInf(p.MinEpoch, 0):
		return bad("MinEpoch (want >= 0)", p.MinEpoch)
	case p.Recovery != Cubic && p.Recovery != Additive:
		return fmt.Errorf("%w: unknown recovery law %v", ErrInvalidPolicy, p.Recovery)
	}
	return nil
}

// Decreased returns, for a decrease from the fraction frac, the fraction
// just after it and the one its recovery levels off at. That level is frac
// when the rate had climbed there from below: the limit is likely just under
// it. When the rate was at the ceiling, nothing says the limit is anywhere
// near; the level is then the decreased fraction itself, and Fraction climbs
// from there toward the ceiling slowly at first, then ever faster.
func (p Policy) Decreased(frac float64) (after, level float64) {
	after = max(p.Floor, frac*p.Decrease)
	if frac >= 1 {
		return after, after
	}
	return after, frac
}

// Fraction returns the fraction of the ceiling the rate is at, elapsed
// after a decrease to after whose recovery levels off at level (see
// Decreased), when a recovery takes span. With u = elapsed/span, Cubic is
// level + u³ when level is after (a decrease from the ceiling); otherwise it
// climbs back to level by u = 1/6, concave, then goes on as
// level + (u-1/6)³. Additive is after + u. The result is never below after
// nor above 1. The Redis backend computes the same in Lua.
func (p Policy) Fraction(after, level float64, elapsed, span time.Duration) float64 {
	if elapsed <= 0 || span <= 0 {
		return min(after, 1)
	}
	u := elapsed.Seconds() / span.Seconds()
	var f float64
	switch {
	case p.Recovery == Additive:
		f = after + u
	case level <= after: // decreased from the ceiling
		f = after + u*u*u
	case u < returnTime:
		w := u/returnTime - 1
		f = level + (level-after)*w*w*w
	default:
		v := u - returnTime
		f = level + v*v*v
	}
	return min(max(f, after), 1)
}
