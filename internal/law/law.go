// Package law is the arithmetic of adaptive.Policy that the bucket
// package applies: the defaults of its fields, the cut of a decrease and
// the climb of a recovery. The Redis backend computes the same in Lua
// (bucket/redis_lua.go), and the bucket tests run one scenario against
// both.
package law

import (
	"time"

	"github.com/sluicehq/sluice/adaptive"
)

// WithDefaults returns p with its zero fields set to
// adaptive.DefaultPolicy's. A negative MinEpoch (no least time between
// decreases) is kept: the bucket reads it as zero.
func WithDefaults(p adaptive.Policy) adaptive.Policy {
	d := adaptive.DefaultPolicy()
	if p.Decrease == 0 {
		p.Decrease = d.Decrease
	}
	if p.Threshold == 0 {
		p.Threshold = d.Threshold
	}
	if p.ThresholdWindows == 0 {
		p.ThresholdWindows = d.ThresholdWindows
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
	if p.HoldWindows == 0 {
		p.HoldWindows = d.HoldWindows
	}
	return p
}

// Decreased returns the fraction of the ceiling a rate at frac is cut to
// under p (with its defaults applied). held is the fraction the last
// decrease cut to, if the key has kept it for HoldWindows since (0 if not,
// or if there was none): the cut goes no lower than that.
func Decreased(p adaptive.Policy, frac, held float64) float64 {
	return max(p.Floor, frac*p.Decrease, min(held, frac))
}

// Fraction returns the fraction of the ceiling the rate is at, elapsed
// after a decrease to after, when a recovery takes span, under p's
// Recovery law. With u = elapsed/span, Cubic is after + u³: it stays close
// to the rate that stopped the refusals, then probes beyond it ever faster.
// Additive is after + u. The result is never above 1.
func Fraction(p adaptive.Policy, after float64, elapsed, span time.Duration) float64 {
	if elapsed <= 0 || span <= 0 {
		return min(after, 1)
	}
	u := elapsed.Seconds() / span.Seconds()
	f := after + u
	if p.Recovery == adaptive.Cubic {
		f = after + u*u*u
	}
	return min(max(f, after), 1)
}
