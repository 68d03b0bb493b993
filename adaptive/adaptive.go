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
	// states it (the IETF RateLimit-Policy's w parameter) or it is known
	// (Anthropic's limits are per minute).
	Window time.Duration
	// Source names the header that stated Limit ("Anthropic-Ratelimit-
	// Requests-Limit", "RateLimit-Policy"), for logs; "" if none did.
	Source string
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

// Feedback is what one response tells about the limit it met.
type Feedback struct {
	// Class is the response's verdict on the request.
	Class Class
	// RetryAfter is how long the provider asked to wait (Retry-After,
	// retry-after-ms) when it refused the request for rate or load (429,
	// 503, 529), zero if it did not: a bucket pauses the key that long for
	// the whole fleet.
	RetryAfter time.Duration
	// HasRetryAfter reports whether the refusal asked for a wait at all,
	// RetryAfter zero included (a Retry-After of 0, or of a date past: a
	// retry may go at once). A refusal that asks for none leaves the wait
	// before a retry to the caller's backoff.
	HasRetryAfter bool
	// Quotas holds what the provider reported, by dimension: the bucket
	// package's names (bucket.Requests, bucket.Tokens, and Anthropic's
	// bucket.InputTokens and bucket.OutputTokens).
	Quotas map[string]Quota
	// Epoch is the bucket epoch the request was reserved in
	// (bucket.Reservation.Epoch); the reader leaves it zero and the caller
	// sets it. A refusal counts toward a rate decrease only if no decrease
	// has happened since the request was reserved.
	Epoch uint64
}

// Empty reports whether f tells a bucket nothing: an accepted response that
// reports no quota and asks for no pause.
func (f Feedback) Empty() bool {
	return f.Class == Accepted && f.RetryAfter <= 0 && len(f.Quotas) == 0
}

// ReportsRate reports whether f tells the rate of some dimension's limit
// (see Quota.Rate).
func (f Feedback) ReportsRate() bool {
	for _, q := range f.Quotas {
		if _, ok := q.Rate(); ok {
			return true
		}
	}
	return false
}

// Recovery is the law by which a rate climbs back after a decrease.
type Recovery uint8

const (
	// Cubic stays close to the decreased rate, then climbs ever faster (the
	// convex half of TCP CUBIC's curve): it spends its time just under the
	// limit, and finds a raised one in the end. A 429 arrives only after the
	// provider's burst is spent, when the rate is already past the limit, so
	// the rate that drew it is no level to return to.
	Cubic Recovery = iota
	// Additive climbs at a constant slope: sooner back, more 429s.
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

// known reports whether r is one of the laws defined here.
func (r Recovery) known() bool { return r == Cubic || r == Additive }

// Policy is the law a bucket follows when its responses are throttled.
// Rates are handled as fractions of the configured limit (the ceiling).
// Threshold refusals within ThresholdWindows windows multiply the fraction
// by Decrease, at most once per epoch (a refusal of a request reserved
// before the last decrease does not count); the fraction then recovers
// toward 1 as the Recovery law says, over a time scaled to the limit's
// window (Burst/Rate), so that a per-minute limit recovers over minutes and
// a per-second one over seconds. The zero Policy is DefaultPolicy: a field
// left zero takes its default, and no field's zero means anything else.
//
// The defaults were chosen with the simulation in the bucket package's
// tests (TestAdaptiveSimulation): against hidden limits per second (token
// bucket, fixed and sliding window servers) and per minute, with a ceiling
// twice too high, they keep 429s under 2% of calls and admit 94% to 99% of
// what the hidden limit allows.
type Policy struct {
	// Decrease multiplies the rate on a decrease, in (0, 1). Default 0.7.
	Decrease float64
	// Threshold is how many refusals within ThresholdWindows windows of the
	// limit make a decrease: one 429 now and then at the exact limit is
	// noise, not a reason to cut. Default 3.
	Threshold int
	// ThresholdWindows is the time over which refusals are counted toward
	// Threshold, in windows of the limit, not counting the time the key
	// was paused by a Retry-After: a pause holds the whole fleet back, so
	// a rate that is too high may draw only one refusal per pause (always,
	// in a single process, which learns of each pause at once), and a
	// count by the clock would never reach the threshold; the fleet would
	// live on pauses at the ceiling. Default 2: refusals of a rate too high
	// come within a window or so of sending; spread wider, they are the
	// jitter of a rate just under the limit, which a full decrease would
	// cost more than it saves.
	ThresholdWindows float64
	// Floor is the lowest fraction of the ceiling the rate falls to, in
	// [1e-6, 1]. Default 0.02.
	Floor float64
	// Recovery is the law of the climb back. Default Cubic.
	Recovery Recovery
	// RecoveryWindows is the time scale of a recovery, in windows of the
	// limit: the rate climbs by the whole ceiling in that long. Default 120:
	// with a ceiling of 40/s (window 1 s) cut to 20/s, Cubic is at 21/s
	// after 35 s, 22.5/s after 48 s, back at 40/s after 95 s; a limit per
	// minute takes as many minutes. Larger is fewer 429s, smaller is a faster
	// return when the provider raises its limit.
	RecoveryWindows float64
	// MinEpoch is the least time between two decreases, in windows of the
	// limit: a decrease takes that long to show in the provider's counters.
	// Zero means the default, 1; negative means none (a decrease may follow
	// the last as soon as Threshold refusals of the new epoch come).
	MinEpoch float64
	// HoldWindows is how long, in windows of the limit, a key must keep the
	// rate its last decrease cut it to for that rate to be known safe: the
	// next decrease then cuts to it, not below, if Decrease would go lower,
	// and one refusal is enough for it (CUBIC returns to the window of its
	// last loss in the same way). Recovery climbs past the limit in the
	// end, and the refusals that follow come from the climb, not from the
	// rate that held; cut by Decrease from just over the limit, the rate
	// would spend a long recovery well under it, and waiting for Threshold
	// refusals, each pausing the fleet, would cost more than the cut. If
	// the refusals go on, the decrease after is a full one: a limit that
	// has really fallen costs one more epoch. Default 10.
	HoldWindows float64
	// ColdStart starts a key empty rather than full, but for its first
	// reservation, which goes at once: the rest follow at the rate, never
	// as a burst. When the configured limit is a guess, its burst is one
	// too; a fleet that starts together with a full burst draws a 429 for
	// everything beyond the provider's burst before any response can teach
	// it. A key forgotten once idle (full again) starts cold again, as TCP
	// restarts slow start after an idle period. The cost is latency for a
	// burst of calls on a fresh key, which goes out at the rate; over any
	// interval a saturated key gets Rate·T instead of Burst + Rate·T. Off
	// by default.
	ColdStart bool
}

// DefaultPolicy returns the policy a bucket follows unless told otherwise.
func DefaultPolicy() Policy {
	return Policy{Decrease: 0.7, Threshold: 3, ThresholdWindows: 2, Floor: 0.02, Recovery: Cubic, RecoveryWindows: 120, MinEpoch: 1, HoldWindows: 10}
}

// ErrInvalidPolicy is matched by errors from Policy.Validate.
var ErrInvalidPolicy = errors.New("adaptive: invalid policy")

// Validate reports whether p is usable: every field zero (its default) or
// within the range its doc gives. The error wraps ErrInvalidPolicy.
func (p Policy) Validate() error {
	switch {
	case p.Decrease != 0 && !(p.Decrease > 0 && p.Decrease < 1):
		return invalidPolicy("Decrease (want 0 < d < 1)", p.Decrease)
	case p.Threshold < 0:
		return invalidPolicy("Threshold (want >= 1)", float64(p.Threshold))
	case !windowCount(p.ThresholdWindows):
		return invalidPolicy("ThresholdWindows (want > 0)", p.ThresholdWindows)
	case p.Floor != 0 && !(p.Floor >= 1e-6 && p.Floor <= 1):
		return invalidPolicy("Floor (want 1e-6 <= f <= 1)", p.Floor) // kept in millionths
	case !windowCount(p.RecoveryWindows):
		return invalidPolicy("RecoveryWindows (want > 0)", p.RecoveryWindows)
	case math.IsNaN(p.MinEpoch) || math.IsInf(p.MinEpoch, 0):
		return invalidPolicy("MinEpoch (want a finite number)", p.MinEpoch)
	case !windowCount(p.HoldWindows):
		return invalidPolicy("HoldWindows (want > 0)", p.HoldWindows)
	case !p.Recovery.known():
		return fmt.Errorf("%w: unknown recovery law %v", ErrInvalidPolicy, p.Recovery)
	}
	return nil
}

// invalidPolicy returns Validate's error for a field whose value v is out
// of range; field names the field and the range it wants.
func invalidPolicy(field string, v float64) error {
	return fmt.Errorf("%w: %s is %v", ErrInvalidPolicy, field, v)
}

// windowCount reports whether v, a Policy's count of windows, is zero (its
// default) or positive and finite.
func windowCount(v float64) bool { return v == 0 || v > 0 && !math.IsInf(v, 0) }
