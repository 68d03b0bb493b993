package bucket

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/adaptive"
)

// adaptation is a token bucket's adaptive law with the times it scales to
// the limit's window: the longest Burst/Rate among the dimensions.
type adaptation struct {
	policy   adaptive.Policy
	window   time.Duration // refusals are counted within one: ThresholdWindows of the limit's
	span     time.Duration // a full recovery: RecoveryWindows windows
	minEpoch time.Duration // the least time between two decreases
	hold     time.Duration // how long a decreased rate must be kept to be known safe
}

func newAdaptation(p adaptive.Policy, dims []dim) adaptation {
	var window float64 // seconds
	for _, d := range dims {
		window = max(window, d.limit.Burst/d.limit.Rate)
	}
	return adaptation{
		policy:   p,
		window:   max(ceilDuration(window*p.ThresholdWindows), time.Microsecond),
		span:     max(ceilDuration(window*p.RecoveryWindows), time.Microsecond),
		minEpoch: ceilDuration(window * p.MinEpoch),
		hold:     ceilDuration(window * p.HoldWindows),
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

// counts reports whether fb is a refusal that counts toward a decrease of
// a key at epoch: rate limited, for a request reserved since the last
// decrease.
func (a *adaptation) counts(fb adaptive.Feedback, epoch uint64) bool {
	return fb.Class == adaptive.RateLimited && fb.Epoch >= epoch
}

// flags is the law as the scripts read it: the Recovery law (0 cubic, 1
// additive), plus 2 for a cold start.
func (a *adaptation) flags() any {
	n := 0
	if a.policy.Recovery == adaptive.Additive {
		n = 1
	}
	if a.policy.ColdStart {
		n += 2
	}
	return smallAmounts[n]
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

// addSaturating returns t+d, or a time far in the future if that overflows.
func addSaturating(t time.Time, d time.Duration) time.Time {
	if d >= time.Duration(math.MaxInt64)-time.Duration(t.UnixNano()) {
		return time.Unix(0, math.MaxInt64)
	}
	return t.Add(d)
}
