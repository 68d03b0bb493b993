package bucket

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/dimension"
)

// Dimension names used by the rest of sluice: adaptive.Feedback reports the
// quotas a provider states under them (Anthropic limits input and output
// tokens apart as well as together). Any other non-empty name works too: a
// Cost is charged against the Limit configured for the same name.
const (
	Requests     = dimension.Requests
	Tokens       = dimension.Tokens
	InputTokens  = dimension.InputTokens
	OutputTokens = dimension.OutputTokens
)

// Limit is a token bucket's shape: it refills at Rate tokens per second up to
// Burst tokens. The zero Limit is invalid.
type Limit struct {
	Rate  float64 // tokens added per second; > 0
	Burst float64 // bucket capacity, the most one instant can take; > 0
}

// PerSecond returns a Limit of n tokens per second with a burst of n.
func PerSecond(n float64) Limit { return Limit{Rate: n, Burst: n} }

// PerMinute returns a Limit of n tokens per minute with a burst of n, the
// shape of most LLM providers' published limits (RPM, TPM).
func PerMinute(n float64) Limit { return Limit{Rate: n / 60, Burst: n} }

// PerDay returns a Limit of n tokens per day with a burst of n: a daily
// cap, to give WithWindow beside a per-minute limit.
func PerDay(n float64) Limit { return Limit{Rate: n / 86400, Burst: n} }

// String formats l as "5/s burst 10".
func (l Limit) String() string {
	return strconv.FormatFloat(l.Rate, 'g', -1, 64) + "/s burst " +
		strconv.FormatFloat(l.Burst, 'g', -1, 64)
}

// The range of a Limit's numbers: what the Redis scripts represent exactly
// (tokens are integer millionths, times integer microseconds, both within
// the 2^53 that a Lua double holds exactly), and more than any API grants.
const (
	minRate, maxRate   = 1e-6, 1e9 // per second
	minBurst, maxBurst = 1e-6, 1e9
	// maxRefill is the longest Burst/Rate, the time an empty bucket takes
	// to fill: 400 days.
	maxRefill = 400 * 24 * time.Hour
)

// Validate reports whether l can be used: Rate within [1e-6, 1e9] per second,
// Burst within [1e-6, 1e9], and Burst/Rate at most 400 days. The
// error is a *LimitError.
func (l Limit) Validate() error {
	switch {
	case !(l.Rate >= minRate && l.Rate <= maxRate):
		return &LimitError{Limit: l, Reason: fmt.Sprintf("rate must be a number from %g to %g per second", minRate, maxRate)}
	case !(l.Burst >= minBurst && l.Burst <= maxBurst):
		return &LimitError{Limit: l, Reason: fmt.Sprintf("burst must be a number from %g to %g", minBurst, maxBurst)}
	case l.Burst/l.Rate > maxRefill.Seconds():
		return &LimitError{Limit: l, Reason: fmt.Sprintf("burst/rate, the time to refill, must be at most %v", maxRefill)}
	}
	return nil
}

// Cost is what one call takes from a bucket, one amount per dimension:
// Cost{Requests: 1, Tokens: 1200}. Dimensions the bucket has no Limit for
// are not limited; amounts must be finite and >= 0.
type Cost map[string]float64

// N is shorthand for Cost{Requests: n}.
func N(n float64) Cost { return Cost{Requests: n} }

// Neg returns c with every amount negated: the delta that refunds c
// through Adjust.
func (c Cost) Neg() Cost {
	d := make(Cost, len(c))
	for k, v := range c {
		d[k] = -v
	}
	return d
}

// dim is one configured dimension of a bucket, or a longer window of one
// (WithWindow).
type dim struct {
	name  string // unique in the bucket: a window's is "<of>/<its length>"
	of    string // the dimension whose amount it takes: name, unless a window
	win   bool   // of != name, known without comparing them on the hot path
	limit Limit
	// pre-formatted (and boxed) for the Redis scripts
	burst any
}

// newDim returns dimension name, which takes the amount of dimension of
// (itself, unless a window), limited to l.
func newDim(name, of string, l Limit) dim {
	return dim{name: name, of: of, win: of != name, limit: l, burst: scriptArg(l.Burst)}
}

// window reports whether d is a longer window of a dimension (WithWindow):
// exact, it takes no part in the adaptive law.
func (d dim) window() bool { return d.win }

func (d dim) checkCost(v float64) error {
	switch {
	case math.IsNaN(v) || v < 0 || math.IsInf(v, 0):
		return &CostError{Dim: d.of, Cost: v, Burst: d.limit.Burst, err: ErrInvalidCost}
	case v > d.limit.Burst:
		return &CostError{Dim: d.name, Cost: v, Burst: d.limit.Burst, err: ErrExceedsBurst}
	}
	return nil
}

func (d dim) String() string { return fmt.Sprintf("%s %v", d.name, d.limit) }

// smallAmounts are the script arguments for the whole amounts 0 to 99.
var smallAmounts = func() (a [100]any) {
	for i := range a {
		a[i] = strconv.Itoa(i)
	}
	return a
}()

// scriptArg formats v as a Redis script argument; the common small whole
// amounts come preformatted, with no allocation.
func scriptArg(v float64) any {
	if v >= 0 && v < float64(len(smallAmounts)) && v == math.Trunc(v) {
		return smallAmounts[int(v)]
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// checkDelta rejects an Adjust amount that is not finite.
func checkDelta(dim string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return &CostError{Dim: dim, Cost: v, err: ErrInvalidCost}
	}
	return nil
}
