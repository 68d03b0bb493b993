package bucket

import (
	"context"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/law"
	"github.com/sluicehq/sluice/internal/wait"
)

// Local is a Bucket kept in this process's memory: the embedded default for
// a single process, and the fallback when Redis cannot be reached. It has the
// same semantics as Redis. Local is safe for concurrent use.
type Local struct {
	dims     []dim
	base     []int // for each dimension, the one whose amount it takes: itself, or a window's dimension
	clock    Clock
	adapt    adaptation
	start    func(key string) time.Time    // nil: keys start full; else empty, not before start(key) (a share)
	windows  func(key string) (Cost, bool) // nil: windows start full; else as it says, if it knows key (a share: its part of what the process saw, no more than the last share left)
	limits   func(key string) []Limit      // nil: every key has dims' limits; else, if not nil for key, lower ones by dimension (a share: the fleet's pins)
	maxDelta []float64                     // the most one Adjust debits or refunds, by dimension
	m        *meters                       // nil: no metrics
	low      *lowWarner                    // nil: keys held low are not reported (a share)
	waiting  refunds                       // of its waiters (WaitMax)

	mu      sync.Mutex
	keys    map[string]*localKey
	sweepAt int // len(keys) at which idle keys are next removed
	// The key advance found last, and its state (nil if none, or swept):
	// a program that uses one key, as most do, finds it with no lookup.
	hotKey string
	hot    *localKey
}

// localKey is one key's state: tokens per dimension (in the order of
// Local.dims) as of last, which is in the future while the key is paused;
// and what Observe learnt.
type localKey struct {
	tokens []float64
	last   time.Time

	epoch       uint64      // decreases so far
	refused     int         // refusals counted since counting
	counting    time.Time   // when the count began, moved on by the pauses since
	decreased   time.Time   // the last decrease; zero if none
	after       float64     // the fraction of the ceiling just after it
	rate, burst []float64   // limits the provider reported; 0 if none (nil: none at all)
	reported    []time.Time // when each dimension's report stops counting
	// The provider's bucket, per dimension, where a report gave its
	// remaining as well as its rate and burst (which rate and burst then
	// hold): its tokens, NaN where there is none. nil: none at all.
	provider []float64

	// credit is what the places of WaitMax's waiters rest on (see
	// constraint): for each dimension, the credit of its tokens, then of
	// its provider bucket's, in tokens (nil: none yet); life changes when
	// they start again.
	credit []float64
	life   uint64
}

// lives numbers the lives of every Local's keys: a key made anew (after
// a sweep) never has the life of the one before, so no waiter reads a
// credit across the two.
var lives atomic.Uint64

// maxCredit is the most a credit holds before it starts again with a new
// life: far from where a float64 stops counting millionths.
const maxCredit = 1 << 32

// addCredit adds d to credit j (see localKey.credit).
func (k *localKey) addCredit(j int, d float64) {
	if d == 0 || math.IsNaN(d) {
		return
	}
	if k.credit == nil {
		k.credit = make([]float64, 2*len(k.tokens))
	}
	if k.credit[j] += d; math.Abs(k.credit[j]) > maxCredit {
		clear(k.credit)
		k.life++
	}
}

// creditOf is credit j in millionths.
func (k *localKey) creditOf(j int) int64 {
	if k.credit == nil {
		return 0
	}
	return int64(math.Round(k.credit[j] * 1e6))
}

// reportable makes k's fields of reports, for n dimensions: none yet.
func (k *localKey) reportable(n int) {
	k.rate, k.burst, k.provider, k.reported = make([]float64, n), make([]float64, n), make([]float64, n), make([]time.Time, n)
	for j := range k.provider {
		k.provider[j] = math.NaN()
	}
}

// prov returns dimension i's provider bucket: its tokens, rate and burst,
// and whether k has one.
func (k *localKey) prov(i int) (tokens, rate, burst float64, ok bool) {
	if k.provider == nil || math.IsNaN(k.provider[i]) {
		return 0, 0, 0, false
	}
	return k.provider[i], k.rate[i], k.burst[i], true
}

var _ Bucket = (*Local)(nil)

// NewLocal returns an in-process bucket that limits Requests to limit, and
// each dimension given WithLimit to its own. It panics with a *LimitError if
// a limit is invalid, and if an option is not one NewLocal takes (WithPrefix
// or WithFailOpen, say, which only a Redis-backed bucket can honour): the
// panic names the option and the constructors that take it. Each option's
// doc says which those are.
func NewLocal(limit Limit, opts ...Option) *Local {
	c, dims := newConfig(forLocal, "NewLocal", limit, opts)
	l := newLocal(dims, c.clock, c.policy, nil, nil)
	l.m = newMeters(c.metrics, dims, func(_ context.Context, key string) (Cost, Cost, error) {
		return l.Tokens(key), l.Rate(key), nil
	}, nil)
	l.low = newLowWarner(c.redis.logger, c.metrics.label, l.m)
	return l
}

// newLocal returns a Local bucket with dims, reading clk, adapting by
// policy. With start, each key starts empty, not before start(key) (a
// share, share.go); with maxDelta, an Adjust debits or refunds up to it,
// by dimension, rather than the dimension's burst.
func newLocal(dims []dim, clk Clock, policy adaptive.Policy, start func(string) time.Time, maxDelta []float64) *Local {
	if maxDelta == nil {
		maxDelta = make([]float64, len(dims))
		for i, d := range dims {
			maxDelta[i] = d.limit.Burst
		}
	}
	base := make([]int, len(dims))
	for i, d := range dims {
		base[i] = slices.IndexFunc(dims, func(e dim) bool { return e.name == d.of })
	}
	return &Local{dims: dims, base: base, clock: clk, adapt: newAdaptation(policy, dims), start: start, maxDelta: maxDelta,
		keys: make(map[string]*localKey), sweepAt: minSweep}
}

const minSweep = 1024

// inlineDims is how many dimensions a Local reads a cost into without
// allocating.
const inlineDims = 8

// Reserve implements Bucket.
func (l *Local) Reserve(_ context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, error) {
	return l.reserve(key, cost, maxWait, false, nil)
}

// reserveAt implements moveUp.
func (l *Local) reserveAt(_ context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, slotMove, error) {
	var place []constraint
	r, err := l.reserve(key, cost, maxWait, true, &place)
	return r, slotMove{movable: true, place: place}, err
}

// shared implements moveUp: a Local's keys are this process's.
func (l *Local) shared(string) bool { return false }

// waiters implements moveUp.
func (l *Local) waiters(string) *waiters { return l.m.waiters() }

// reserve is Reserve, recording it (see meters.reserved on counted), and
// setting *place, if place is not nil, to the place of a wait that may
// move up.
func (l *Local) reserve(key string, cost Cost, maxWait time.Duration, counted bool, place *[]constraint) (Reservation, error) {
	if key == "" {
		return l.invalid(key, cost, ErrInvalidKey)
	}
	var buf [inlineDims]float64
	a := l.amounts(cost, buf[:])
	for i, v := range a {
		if d := &l.dims[i]; !(v >= 0 && v <= d.limit.Burst) { // NaN and infinities fail too
			return l.invalid(key, cost, d.checkCost(v))
		}
	}
	now := l.clock.Now()
	// Unlocked by hand: nothing in between panics, and a deferred unlock
	// costs a twentieth of the call.
	l.mu.Lock()
	k := l.advance(key, now, a)
	f := l.fraction(k, now)
	var secs float64 // in seconds after k.last
	for i, c := range a {
		if c == 0 {
			continue // a dimension not charged is not held back by its debt
		}
		if deficit := c - k.tokens[i]; deficit > 0 {
			secs = max(secs, deficit/l.rate(k, i, f))
		}
		if pt, pr, _, ok := k.prov(i); ok && c > pt {
			secs = max(secs, (c-pt)/pr)
		}
	}
	// Advanced, k is at now unless paused: the comparison, inlined, saves
	// the call of Sub on every reservation.
	var paused time.Duration // until k.last
	if k.last != now {
		paused = max(k.last.Sub(now), 0)
	}
	w := wait.Add(wait.Seconds(secs), paused)
	r := Reservation{OK: true, Delay: w, Epoch: k.epoch}
	if w > max(maxWait, 0) || w == Unlimited { // a wait of 292 years is none, as on Redis
		r = Reservation{RetryAfter: w, Epoch: k.epoch}
	} else {
		for i, c := range a {
			k.tokens[i] -= c
			if k.provider != nil {
				k.provider[i] -= c // NaN stays NaN
			}
		}
		if place != nil && w >= minMoveUp {
			*place = l.constraints(k, a, f, now)
		}
	}
	l.mu.Unlock()
	if l.m != nil {
		l.m.reserved(key, cost, r, nil, servedLocal, counted)
	}
	return r, nil
}

// constraints returns, for each dimension that a charges, in order, its
// tokens' and its provider bucket's constraint (see constraint) as k is at
// now, with fraction f: when its debt is paid, its credit, its rate, and
// the end of k's pause. l.mu must be held.
func (l *Local) constraints(k *localKey, a []float64, f float64, now time.Time) []constraint {
	wall := time.Now()
	from := wall.Add(max(k.last.Sub(now), 0))
	life := strconv.FormatUint(k.life, 10)
	n := len(l.dims)
	var cs []constraint
	for i, c := range a {
		if c == 0 {
			continue
		}
		r := l.rate(k, i, f)
		tk := constraint{ok: true, at: from.Add(wait.Seconds(max(-k.tokens[i], 0) / r)), from: from,
			credit: k.creditOf(i), rate: r, life: life}
		pv := constraint{from: from, life: life}
		if pt, pr, _, ok := k.prov(i); ok {
			pv = constraint{ok: true, at: from.Add(wait.Seconds(max(-pt, 0) / pr)), from: from,
				credit: k.creditOf(n + i), rate: pr, life: life}
		}
		cs = append(cs, tk, pv)
	}
	return cs
}

// amounts returns c's amount for each of l's dimensions, in their order,
// each read once (a window takes its dimension's); in buf if it is long
// enough.
func (l *Local) amounts(c Cost, buf []float64) []float64 {
	a := buf
	if len(a) < len(l.dims) {
		a = make([]float64, len(l.dims))
	}
	a = a[:len(l.dims)]
	for i := range l.dims {
		if j := l.base[i]; j < i {
			a[i] = a[j]
		} else {
			a[i] = c[l.dims[i].of]
		}
	}
	return a
}

// invalid is Reserve's return of err, a cost or key it cannot take.
func (l *Local) invalid(key string, cost Cost, err error) (Reservation, error) {
	if l.m != nil {
		l.m.reserved(key, cost, Reservation{}, err, servedLocal, false)
	}
	return Reservation{}, err
}

func (l *Local) refunds() *refunds { return &l.waiting }

// earliest implements moveUp: the end of key's queue in each bucket that
// cost charges, with its credit.
func (l *Local) earliest(_ context.Context, key string, cost Cost) (queue, error) {
	if key == "" {
		return queue{}, ErrInvalidKey
	}
	var buf [inlineDims]float64
	a := l.amounts(cost, buf[:])
	now := l.clock.Now()
	l.mu.Lock()
	k := l.peek(key, now)
	cs := l.constraints(k, a, l.fraction(k, now), now)
	l.mu.Unlock()
	q := queue{end: time.Now(), cons: cs}
	for _, c := range cs {
		if c.ok {
			q.end = later(q.end, c.at)
		}
	}
	return q, nil
}

// Adjust implements Bucket.
func (l *Local) Adjust(_ context.Context, key string, delta Cost) error {
	return l.adjust(key, delta, false)
}

// Settle implements Settler: a refund moves up every waiter (see the
// package function Settle).
func (l *Local) Settle(_ context.Context, key string, delta Cost) error {
	return l.adjust(key, delta, true)
}

// adjust is Adjust, of a served call's delta if served: a refund is
// credited then; a debit always is, negative.
func (l *Local) adjust(key string, delta Cost, served bool) error {
	if key == "" {
		return ErrInvalidKey
	}
	for name, v := range delta {
		if err := checkDelta(name, v); err != nil {
			return err
		}
	}
	l.m.adjusted(key, delta)
	defer l.waiting.fire(key, delta) // after the refund, once l.mu is released
	var buf [inlineDims]float64
	a := l.amounts(delta, buf[:])
	if !slices.ContainsFunc(a, nonZero) {
		return nil // as on Redis, which runs nothing for it: no key is made or written
	}
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.advance(key, now, nil)
	n := len(l.dims)
	for i, d := range l.dims {
		// A debit takes at most a burst, and a refund gives back at most
		// one: no call can cost more (see Adjust).
		debit := max(min(a[i], l.maxDelta[i]), -l.maxDelta[i])
		tk := k.tokens[i]
		k.tokens[i] = min(k.tokens[i]-debit, l.burst(k, i, l.fraction(k, now)))
		if pt, _, pb, ok := k.prov(i); ok {
			k.provider[i] = min(pt-debit, pb)
			if ch := k.provider[i] - pt; served || ch < 0 {
				k.addCredit(n+i, ch)
			}
		}
		if k.last.After(now) && !d.window() { // a window is not paused (see Observe)
			// Paused: the bucket stays empty at the pause's end, or what a
			// refund gave back would go out all at once then.
			k.tokens[i] = min(k.tokens[i], 0)
		}
		if ch := k.tokens[i] - tk; served || ch < 0 {
			k.addCredit(i, ch)
		}
	}
	return nil
}

// nonZero reports whether an amount charges or refunds anything.
func nonZero(v float64) bool { return v != 0 }

// Observe implements Bucket: see the Bucket interface and adaptive.Policy.
func (l *Local) Observe(_ context.Context, key string, fb adaptive.Feedback) error {
	if fb.Empty() {
		return nil
	}
	if key == "" {
		return ErrInvalidKey
	}
	decreased, paused := l.observe(key, fb)
	l.m.observed(key, decreased, paused)
	if now := l.clock.Now(); l.low.due(key, now) {
		l.low.warn(key, l.lowOf(key, fb), now)
	}
	l.waiting.accepted(key, fb)
	return nil
}

// observe is Observe, saying whether it decreased the rate and whether it
// set or lengthened a pause.
func (l *Local) observe(key string, fb adaptive.Feedback) (decreased, paused bool) {
	reports, rated := l.reports(fb)
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.advance(key, now, nil)
	if fb.Class != adaptive.Accepted || reports != nil {
		// What it may cut from the tokens beyond time is debited from
		// the credits.
		defer l.debitCuts(k, l.before(k, now))
	}
	if rated {
		// The provider says what its limit is: that replaces what
		// refusals taught.
		k.decreased, k.refused, k.counting = time.Time{}, 0, time.Time{}
	} else if l.adapt.counts(fb, k.epoch) {
		if now.Sub(k.counting) > l.adapt.window {
			k.refused, k.counting = 0, now
		}
		k.refused++
		held := l.adapt.held(k.after, k.decreased, now)
		if (k.refused >= l.adapt.policy.Threshold || held > 0) && (k.decreased.IsZero() || now.Sub(k.decreased) >= l.adapt.minEpoch) {
			k.after = law.Decreased(l.adapt.policy, l.fraction(k, now), held)
			k.decreased = now
			k.epoch++
			k.refused, k.counting = 0, time.Time{} // the next refusal starts a count
			decreased = true
		}
	}
	believed := false
	for _, r := range reports {
		believed = believed || r.says()
	}
	if d := l.adapt.pause(fb, believed); d > 0 {
		// Nothing more until the pause ends, then the rate: the bucket is
		// empty at that moment, so what is reserved meanwhile is spread.
		// Slots reserved before keep their times (see pauseTokens).
		// The time paused does not count toward the threshold's window.
		if until := now.Add(d); until.After(k.last) {
			f := l.fraction(k, now)
			for i := range k.tokens {
				if l.dims[i].window() {
					// Not paused: it would lose what it holds, for its
					// whole refill. It refills meanwhile.
					k.tokens[i] = min(k.tokens[i]+until.Sub(k.last).Seconds()*l.rate(k, i, f), l.burst(k, i, f))
					continue
				}
				k.tokens[i] = pauseTokens(k.tokens[i], until.Sub(k.last), l.rate(k, i, f))
				if pt, pr, pb, ok := k.prov(i); ok { // it refills meanwhile
					k.provider[i] = min(pb, pt+until.Sub(k.last).Seconds()*pr)
				}
			}
			if k.refused > 0 {
				k.counting = k.counting.Add(until.Sub(k.last))
			}
			k.last = until
			paused = true
		}
	}
	for i, r := range reports {
		pt, _, _, had := k.prov(i)
		if r.rate == 0 && r.burst == 0 {
			switch {
			case r.rem < 0:
			case had:
				k.provider[i] = min(pt, r.rem)
			default:
				k.tokens[i] = min(k.tokens[i], r.rem)
			}
			continue
		}
		if k.rate == nil {
			n := len(l.dims)
			k.rate, k.burst, k.provider, k.reported = make([]float64, n), make([]float64, n), make([]float64, n), make([]time.Time, n)
			for j := range k.provider {
				k.provider[j] = math.NaN()
			}
		}
		if had && r.rate == 0 && r.rem >= 0 {
			// A report of the provider's bucket that gives no rate (it is
			// full): the rate it last gave stands.
			k.provider[i] = min(pt, r.rem)
			if r.burst > 0 {
				k.burst[i] = r.burst
			}
		} else if r.rate > 0 && r.burst > 0 && r.rem >= 0 {
			// The provider's bucket: its remaining now, never raised by a
			// report that may be older than what the fleet has spent
			// since, but seeded anew once the last report has run its time.
			if had {
				k.provider[i] = min(pt, r.rem)
			} else {
				k.provider[i] = min(r.rem, r.burst)
			}
			k.rate[i], k.burst[i] = r.rate, r.burst
		} else {
			if had {
				k.tokens[i] = min(k.tokens[i], pt) // what the provider's bucket was owed stays owed, in ours
			}
			k.provider[i] = math.NaN() // caps on ours
			if r.rem >= 0 {
				k.tokens[i] = min(k.tokens[i], r.rem)
			}
			k.rate[i], k.burst[i] = r.rate, r.burst // a report replaces the last
		}
		k.reported[i] = now.Add(r.until)
	}
	f := l.fraction(k, now)
	for i := range k.tokens {
		k.tokens[i] = min(k.tokens[i], l.burst(k, i, f))
	}
	return decreased, paused
}

// lowOf returns the dimensions of key that its state holds below
// lowFraction of their configured limits, just after an Observe of fb: by
// what the provider reported (fb's header, if it reported it), or else by
// the law's decreases.
func (l *Local) lowOf(key string, fb adaptive.Feedback) []lowLimit {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.keys[key]
	if k == nil {
		return nil
	}
	f := l.fraction(k, now)
	var low []lowLimit
	for i, d := range l.dims {
		if d.window() {
			continue
		}
		eff := Limit{Rate: l.rate(k, i, f), Burst: l.burst(k, i, f)}
		if _, pr, pb, ok := k.prov(i); ok {
			eff = Limit{Rate: min(eff.Rate, pr), Burst: min(eff.Burst, pb)}
		}
		if !below(eff, d.limit) {
			continue
		}
		by := byRefusals
		if reported := (Limit{Rate: eff.Rate / f, Burst: eff.Burst / f}); below(reported, d.limit) {
			by = sourceOf(fb.Quotas[d.name])
		}
		low = append(low, lowLimit{dim: d, effective: eff, by: by})
	}
	return low
}

// tokensBefore is a key's tokens before observe changes them, and how
// they were refilling: by dimension, its own, then its provider bucket's
// (NaN tokens: none).
type tokensBefore struct {
	last                time.Time
	tokens, rate, burst []float64
}

// before returns k's tokensBefore at now. l.mu must be held.
func (l *Local) before(k *localKey, now time.Time) tokensBefore {
	n := len(l.dims)
	b := tokensBefore{last: k.last, tokens: make([]float64, 2*n), rate: make([]float64, 2*n), burst: make([]float64, 2*n)}
	f := l.fraction(k, now)
	for i := range n {
		b.tokens[i], b.rate[i], b.burst[i] = k.tokens[i], l.rate(k, i, f), l.burst(k, i, f)
		b.tokens[n+i] = math.NaN()
		if pt, pr, pb, ok := k.prov(i); ok {
			b.tokens[n+i], b.rate[n+i], b.burst[n+i] = pt, pr, pb
		}
	}
	return b
}

// debitCuts debits from k's credits what observe took from its tokens
// beyond time since b, against what time alone would have left by the end
// of its pause; a provider bucket seeded anew starts a new life. l.mu must
// be held.
func (l *Local) debitCuts(k *localKey, b tokensBefore) {
	n := len(l.dims)
	dt := k.last.Sub(b.last).Seconds()
	for i := range n {
		if left := min(b.burst[i], b.tokens[i]+dt*b.rate[i]); k.tokens[i] < left {
			k.addCredit(i, k.tokens[i]-left)
		}
		pt, _, _, ok := k.prov(i)
		switch {
		case !ok:
		case math.IsNaN(b.tokens[n+i]):
			k.life++
			if k.credit != nil {
				k.credit[n+i] = 0
			}
		default:
			if left := min(b.burst[n+i], b.tokens[n+i]+dt*b.rate[n+i]); pt < left {
				k.addCredit(n+i, pt-left)
			}
		}
	}
}

// reports returns fb's quotas for l's dimensions, bounded (nil if there are
// none), and whether one of them reports a rate.
func (l *Local) reports(fb adaptive.Feedback) (reports []report, rated bool) {
	if len(fb.Quotas) == 0 {
		return nil, false
	}
	reports = make([]report, len(l.dims))
	for i, d := range l.dims {
		reports[i] = report{rem: -1}
		if q, ok := fb.Quotas[d.name]; ok && !d.window() { // a report speaks of the dimension's own limit
			reports[i] = l.adapt.report(q, d.limit)
			rated = rated || reports[i].rate > 0
		}
	}
	return reports, rated
}

// Rate returns the rate, per second, key refills at now in each dimension:
// the configured limit's times the fraction the adaptive law has it at, or
// the provider's if it reported a lower one (its bucket's refill, where it
// reported the bucket: what remains there goes at ours). It changes
// nothing (see Tokens).
func (l *Local) Rate(key string) Cost {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.peek(key, now)
	f := l.fraction(k, now)
	c := make(Cost, len(l.dims))
	for i, d := range l.dims {
		c[d.name] = l.rate(k, i, f)
		if _, pr, _, ok := k.prov(i); ok {
			c[d.name] = min(c[d.name], pr)
		}
	}
	return c
}

// fraction is the share of its ceiling k's rate is at now.
func (l *Local) fraction(k *localKey, now time.Time) float64 {
	if k.decreased.IsZero() {
		return 1 // inlined: most keys never decrease
	}
	return l.decreasedFraction(k, now)
}

// decreasedFraction is fraction for a key whose rate has decreased.
func (l *Local) decreasedFraction(k *localKey, now time.Time) float64 {
	return law.Fraction(l.adapt.policy, k.after, now.Sub(k.decreased), l.adapt.span)
}

// rate is dimension i's refill rate for k at fraction f (which does not
// scale a window): the configured one, lowered to a reported one unless the
// report gave a provider's bucket larger than ours: a constraint of its own,
// whose stored tokens a rate lowered to its refill would waste. One no
// larger than ours loses nothing so, and our bucket paced so does not send
// its refill on top of what it holds after a pause.
func (l *Local) rate(k *localKey, i int, f float64) float64 {
	if l.dims[i].window() {
		return l.dims[i].limit.Rate
	}
	r := l.dims[i].limit.Rate
	if k.rate != nil && k.rate[i] > 0 && (math.IsNaN(k.provider[i]) || k.burst[i] <= l.dims[i].limit.Burst) {
		r = min(r, k.rate[i])
	}
	return r * f
}

// burst is dimension i's capacity for k at fraction f: scaled as the rate
// is, or a slowed key would gather the burst of its ceiling while idle.
func (l *Local) burst(k *localKey, i int, f float64) float64 {
	if l.dims[i].window() {
		return l.dims[i].limit.Burst
	}
	b := l.dims[i].limit.Burst
	if k.burst != nil && k.burst[i] > 0 {
		b = min(b, k.burst[i])
	}
	return b * f
}

// queueEnd returns when the last slot reserved on key comes due, the time
// its deepest debt is repaid, its own or its provider bucket's; the zero
// time if it has no debt.
func (l *Local) queueEnd(key string) time.Time {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k, ok := l.keys[key]
	if !ok {
		return time.Time{}
	}
	var end time.Time
	f := l.fraction(k, now)
	for i := range l.dims {
		if k.tokens[i] < 0 {
			if t := k.last.Add(wait.Seconds(-k.tokens[i] / l.rate(k, i, f))); t.After(end) {
				end = t
			}
		}
		if pt, pr, _, ok := k.prov(i); ok && pt < 0 {
			if t := k.last.Add(wait.Seconds(-pt / pr)); t.After(end) {
				end = t
			}
		}
	}
	return end
}

// windowTokens returns key's windows' tokens now, if l has key.
func (l *Local) windowTokens(key string) (Cost, bool) {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.keys[key]; !ok {
		return nil, false
	}
	k := l.peek(key, now)
	c := make(Cost)
	for i, d := range l.dims {
		if d.window() {
			c[d.name] = k.tokens[i]
		}
	}
	return c, true
}

// Tokens returns what Redis.Tokens does, from this process's memory. Like
// every read, it changes nothing (it makes no key).
func (l *Local) Tokens(key string) Cost {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.peek(key, now)
	c := make(Cost, len(l.dims))
	for i, d := range l.dims {
		c[d.name] = k.tokens[i]
		if pt, _, _, ok := k.prov(i); ok {
			c[d.name] = min(c[d.name], pt)
		}
	}
	return c
}

// advance returns key's state refilled up to now, creating it (see add).
// l.mu must be held.
func (l *Local) advance(key string, now time.Time, first []float64) *localKey {
	k := l.hot
	if k == nil || key != l.hotKey {
		var ok bool
		if k, ok = l.keys[key]; !ok {
			k = l.add(key, now, first)
		}
		l.hotKey, l.hot = key, k
	}
	l.refill(k, now)
	return k
}

// peek returns key's state refilled up to now as advance does, changing
// nothing: a copy, or a new key's state if l has none. A read so writes
// nothing, as on Redis: a key refilled by a read at a fraction or a cap
// that later changes would hold what the scripts' key does not, and a new
// key would start (empty, on a cold start) before the call that makes it
// on Redis. l.mu must be held.
func (l *Local) peek(key string, now time.Time) *localKey {
	k := l.hot
	if k == nil || key != l.hotKey {
		var ok bool
		if k, ok = l.keys[key]; !ok {
			k = l.fresh(key, now, nil)
			l.refill(k, now)
			return k
		}
	}
	c := *k
	// What refill writes: the rest is read only.
	c.tokens, c.rate, c.burst, c.provider = slices.Clone(k.tokens), slices.Clone(k.rate), slices.Clone(k.burst), slices.Clone(k.provider)
	l.refill(&c, now)
	return &c
}

// refill refills k up to now: until a report's end at the rate and burst
// it gave (see fold), at l.rate and l.burst since. l.mu must be held.
func (l *Local) refill(k *localKey, now time.Time) {
	if k.rate != nil {
		for i, u := range k.reported {
			if !now.Before(u) { // the report has run its time
				l.fold(k, i, u, now)
			}
		}
	}
	elapsed := now.Sub(k.last).Seconds()
	switch {
	case elapsed <= 0:
		return
	case k.rate == nil && k.decreased.IsZero():
		// What most keys are: every rate and burst is its limit's
		// (l.rate and l.burst at fraction 1, with no report), and
		// there is no provider bucket (observe makes it with k.rate).
		for i := range l.dims {
			lim := &l.dims[i].limit
			k.tokens[i] = min(k.tokens[i]+elapsed*lim.Rate, lim.Burst)
		}
	default:
		f := l.fraction(k, now)
		for i := range l.dims {
			k.tokens[i] = min(k.tokens[i]+elapsed*l.rate(k, i, f), l.burst(k, i, f))
			if pt, pr, pb, ok := k.prov(i); ok {
				k.provider[i] = min(pt+elapsed*pr, pb)
			}
		}
	}
	k.last = now
}

// fold ends dimension i's report, whose time ran out at u (by now), in
// k's tokens: they refilled at the rate and burst it gave until u, and
// hold no more then than its provider's bucket, if any (what that was
// owed at its end stays owed, in ours; a new life, since no waiter's place
// there holds any more). A debt then was paced at the report's rate (or
// the provider's bucket's): its slots go out until it is repaid at that
// pace. It is carried into ours at what it is worth at our rate, so that
// it is repaid at the same moment, and no call reserved after the end
// lands before the last of those slots (TestCapEndBoundsTheFleet). From u
// they refill at ours: refill adds that from k.last, so what it would add
// up to u is taken off here. Once: the report's rate and burst go. l.mu
// must be held.
func (l *Local) fold(k *localKey, i int, u, now time.Time) {
	if k.rate[i] == 0 && k.burst[i] == 0 {
		return // none, or folded
	}
	f := l.fraction(k, now)
	d := max(u.Sub(k.last).Seconds(), 0)
	rc := l.rate(k, i, f)
	tu := min(k.tokens[i]+d*rc, l.burst(k, i, f))
	pt, pr, pb, had := k.prov(i)
	k.rate[i], k.burst[i], k.provider[i] = 0, 0, math.NaN()
	r := l.rate(k, i, f) // ours
	if tu < 0 {
		tu *= r / rc
	}
	if had {
		p := min(pt+d*pr, pb)
		if p < 0 {
			p *= r / pr
		}
		tu = min(tu, p)
		k.life++
	}
	k.tokens[i] = tu - d*r
}

// add makes and keeps key's state as of now: full; or under a ColdStart policy
// empty, but for first, the amounts (by dimension) of the reservation that
// creates it (nil if none does). l.mu must be held.
func (l *Local) add(key string, now time.Time, first []float64) *localKey {
	l.sweep(now)
	k := l.fresh(key, now, first)
	l.keys[key] = k
	return k
}

// fresh returns a new state of key as of now (see add), not kept. l.mu
// must be held.
func (l *Local) fresh(key string, now time.Time, first []float64) *localKey {
	k := &localKey{tokens: make([]float64, len(l.dims)), last: now, life: lives.Add(1)}
	if l.start != nil {
		if t := l.start(key); t.After(now) {
			k.last = t
		}
	}
	for i, d := range l.dims {
		switch {
		case d.window():
			// Full, in a share too: empty, it would hold the fleet to
			// its refill, a day's for a daily window. But a share
			// after another takes up the last one's: a flapping Redis
			// must not hand out a day each time.
			k.tokens[i] = d.limit.Burst
			if l.windows != nil {
				if c, ok := l.windows(key); ok {
					k.tokens[i] = min(k.tokens[i], c[d.name])
				}
			}
		case l.start != nil:
			k.tokens[i] = 0
		case l.adapt.policy.ColdStart && first != nil:
			k.tokens[i] = min(d.limit.Burst, first[i])
		case l.adapt.policy.ColdStart:
			k.tokens[i] = 0
		default:
			k.tokens[i] = d.limit.Burst
		}
	}
	if l.limits != nil {
		l.lower(k, l.limits(key))
	}
	return k
}

// lower holds k, a new key, to limits, by dimension, where they are below
// its dimensions' own (windows excepted), as a provider's report that
// never ends holds a key (see rate and burst). nil changes nothing.
func (l *Local) lower(k *localKey, limits []Limit) {
	for i, d := range l.dims {
		if i >= len(limits) || d.window() || limits[i].Rate >= d.limit.Rate && limits[i].Burst >= d.limit.Burst {
			continue
		}
		if k.rate == nil {
			k.reportable(len(l.dims))
		}
		k.rate[i], k.burst[i] = min(limits[i].Rate, d.limit.Rate), min(limits[i].Burst, d.limit.Burst)
		k.reported[i] = k.last.Add(pinnedFor)
		k.tokens[i] = min(k.tokens[i], k.burst[i])
	}
}

// pinnedFor is how long a share holds a key to the fleet's pins: for the
// share's life.
const pinnedFor = 100 * 365 * 24 * time.Hour

// sweep forgets keys that have refilled completely, once the map has grown
// to sweepAt; their state equals a new key's (one that starts cold is
// emptier, as adaptive.Policy.ColdStart says). l.mu must be held.
func (l *Local) sweep(now time.Time) {
	if len(l.keys) < l.sweepAt {
		return
	}
	for name, k := range l.keys {
		if l.fraction(k, now) < 1 || k.refused > 0 && now.Sub(k.counting) <= l.adapt.window ||
			k.rate != nil && slices.ContainsFunc(k.reported, now.Before) {
			continue // what it learnt still matters
		}
		if k.rate != nil {
			// A report that has run its time leaves what it was owed in
			// the tokens (advance): that is owed still.
			k = l.advance(name, now, nil)
		}
		full := true
		elapsed := now.Sub(k.last).Seconds()
		for i, d := range l.dims {
			if k.tokens[i]+elapsed*d.limit.Rate < d.limit.Burst {
				full = false
				break
			}
		}
		if full {
			delete(l.keys, name)
			if k == l.hot {
				l.hot = nil
			}
		}
	}
	l.sweepAt = max(minSweep, 2*len(l.keys))
}
