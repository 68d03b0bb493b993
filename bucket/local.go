package bucket

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/wait"
)

// Local is a Bucket kept in this process's memory: the embedded default for
// a single process, and the fallback when Redis cannot be reached. It has the
// same semantics as Redis. Local is safe for concurrent use.
//
// Local is the token bucket's law (tokenlaw.go) applied to a map of keys
// under one mutex: each operation finds its key's state and applies a rule
// to it (reserve, settle, observe), or reads it refilled (peek).
type Local struct {
	tokenLaw       // its dimensions and adaptive law, and the rules it applies to its keys
	base     []int // for each dimension, the one whose amount it takes: itself, or a window's dimension
	clock    Clock
	start    func(key string) time.Time    // nil: keys start full; else empty, not before start(key) (a share)
	windows  func(key string) (Cost, bool) // nil: windows start full; else as it says, if it knows key (a share: its part of what the process saw, no more than the last share left)
	limits   func(key string) []Limit      // nil: every key has dims' limits; else, if not nil for key, lower ones by dimension (a share: the fleet's pins)
	maxDelta []float64                     // the most one Adjust debits or refunds, by dimension
	m        *meters                       // nil: no metrics
	low      *lowWarner                    // nil: keys held low are not reported (a share)
	waiting  refunds                       // of its waiters (WaitMax)

	mu      sync.Mutex
	keys    map[string]*keyState
	sweepAt int // len(keys) at which idle keys are next removed
	// The key find found last, and its state (nil if none, or swept):
	// a program that uses one key, as most do, finds it with no lookup.
	hotKey string
	hot    *keyState
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
	return &Local{tokenLaw: tokenLaw{dims: dims, adapt: newAdaptation(policy, dims)}, base: base, clock: clk, start: start,
		maxDelta: maxDelta, keys: make(map[string]*keyState), sweepAt: minSweep}
}

const minSweep = 1024

// inlineDims is how many dimensions a Local reads a cost into without
// allocating.
const inlineDims = 8

// Reserve implements Bucket.
func (l *Local) Reserve(_ context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, error) {
	return l.reservation(key, cost, maxWait, false, nil)
}

// reserveAt implements moveUp.
func (l *Local) reserveAt(_ context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, slotMove, error) {
	var place []constraint
	r, err := l.reservation(key, cost, maxWait, true, &place)
	return r, slotMove{movable: true, place: place}, err
}

// shared implements moveUp: a Local's keys are this process's.
func (l *Local) shared(string) bool { return false }

// waiters implements moveUp.
func (l *Local) waiters(string) *waiters { return l.m.waiters() }

// reservation is Reserve (the rule reserve on key's state), recording it
// (see meters.reserved on counted), and setting *place, if place is not
// nil, to the place of a wait that may move up.
func (l *Local) reservation(key string, cost Cost, maxWait time.Duration, counted bool, place *[]constraint) (Reservation, error) {
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
	k := l.find(key, now, a)
	w, took, f := l.reserve(k, a, maxWait, now)
	var r Reservation
	if took {
		r = Reservation{OK: true, Delay: w, Epoch: k.law.epoch}
		if place != nil && w >= minMoveUp {
			*place = l.constraints(k, a, f, now)
		}
	} else {
		r = Reservation{RetryAfter: w, Epoch: k.law.epoch}
	}
	l.mu.Unlock()
	if l.m != nil {
		l.m.reserved(key, cost, r, nil, servedLocal, counted)
	}
	return r, nil
}

// constraints returns, for each dimension that a charges, in order, its
// place (see dimState.place) in k as it is at now, with fraction f, from
// the end of k's pause on the wall clock, which waiters sleep by. l.mu
// must be held.
func (l *Local) constraints(k *keyState, a []float64, f float64, now time.Time) []constraint {
	from := time.Now().Add(max(k.at.Sub(now), 0))
	life := strconv.FormatUint(k.life, 10)
	var cs []constraint
	for i, c := range a {
		if c == 0 {
			continue
		}
		own, prov := k.dims[i].place(&l.dims[i], f, from, life)
		cs = append(cs, own, prov)
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
	cs := l.constraints(k, a, l.fraction(&k.law, now), now)
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

// adjust is Adjust (the rule settle on key's state), of a served call's
// delta if served: a refund is credited then; a debit always is, negative.
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
	l.settle(l.find(key, now, nil), a, l.maxDelta, served, now)
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
	decreased, paused := l.observeKey(key, fb)
	l.m.observed(key, decreased, paused)
	if now := l.clock.Now(); l.low.due(key, now) {
		l.low.warn(key, l.lowOf(key, fb), now)
	}
	l.waiting.accepted(key, fb)
	return nil
}

// observeKey is Observe: the rule observe on key's state. It says
// whether that decreased the rate and whether it set or lengthened a pause.
func (l *Local) observeKey(key string, fb adaptive.Feedback) (decreased, paused bool) {
	o := l.observation(fb)
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.observe(l.find(key, now, nil), o, now)
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
	f := l.fraction(&k.law, now)
	var low []lowLimit
	for i, d := range l.dims {
		if d.window() {
			continue
		}
		s := &k.dims[i]
		eff := Limit{Rate: s.rate(&d, f), Burst: s.burst(&d, f)}
		if s.hasProvider() {
			eff = Limit{Rate: min(eff.Rate, s.reportedRate), Burst: min(eff.Burst, s.reportedBurst)}
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

// observation returns what fb teaches a key of l's: its quotas for l's
// dimensions, bounded (none if it has none), and how long it pauses it.
func (l *Local) observation(fb adaptive.Feedback) observation {
	o := observation{fb: fb}
	if len(fb.Quotas) > 0 {
		o.reports = make([]report, len(l.dims))
		for i, d := range l.dims {
			o.reports[i] = report{rem: -1}
			if q, ok := fb.Quotas[d.name]; ok && !d.window() { // a report speaks of the dimension's own limit
				o.reports[i] = l.adapt.report(q, d.limit)
				o.rated = o.rated || o.reports[i].rate > 0
			}
		}
	}
	o.pause = l.adapt.pause(fb, slices.ContainsFunc(o.reports, report.says))
	return o
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
	f := l.fraction(&k.law, now)
	c := make(Cost, len(l.dims))
	for i, d := range l.dims {
		s := &k.dims[i]
		c[d.name] = s.rate(&d, f)
		if s.hasProvider() {
			c[d.name] = min(c[d.name], s.reportedRate)
		}
	}
	return c
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
	f := l.fraction(&k.law, now)
	for i := range k.dims {
		s := &k.dims[i]
		if s.tokens < 0 {
			end = later(end, k.at.Add(wait.Seconds(-s.tokens/s.rate(&l.dims[i], f))))
		}
		if s.hasProvider() && s.provider < 0 {
			end = later(end, k.at.Add(wait.Seconds(-s.provider/s.reportedRate)))
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
			c[d.name] = k.dims[i].tokens
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
		s := &k.dims[i]
		c[d.name] = s.tokens
		if s.hasProvider() {
			c[d.name] = min(c[d.name], s.provider)
		}
	}
	return c
}

// find returns key's state, as it is, creating it (see add). l.mu must be
// held.
func (l *Local) find(key string, now time.Time, first []float64) *keyState {
	if k := l.hot; k != nil && key == l.hotKey {
		return k // inlined
	}
	return l.lookup(key, now, first)
}

// lookup is find of a key other than the hot one, which it becomes.
func (l *Local) lookup(key string, now time.Time, first []float64) *keyState {
	k, ok := l.keys[key]
	if !ok {
		k = l.add(key, now, first)
	}
	l.hotKey, l.hot = key, k
	return k
}

// peek returns key's state refilled up to now (refill), changing
// nothing: a copy, or a new key's state if l has none. A read so writes
// nothing, as on Redis: a key refilled by a read at a fraction or a cap
// that later changes would hold what the scripts' key does not, and a new
// key would start (empty, on a cold start) before the call that makes it
// on Redis. l.mu must be held.
func (l *Local) peek(key string, now time.Time) *keyState {
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
	c.dims = slices.Clone(k.dims)
	l.refill(&c, now)
	return &c
}

// add makes and keeps key's state as of now: full; or under a ColdStart policy
// empty, but for first, the amounts (by dimension) of the reservation that
// creates it (nil if none does). l.mu must be held.
func (l *Local) add(key string, now time.Time, first []float64) *keyState {
	l.sweep(now)
	k := l.fresh(key, now, first)
	l.keys[key] = k
	return k
}

// fresh returns a new state of key as of now (see add), not kept. l.mu
// must be held.
func (l *Local) fresh(key string, now time.Time, first []float64) *keyState {
	k := &keyState{at: now, life: lives.Add(1), dims: make([]dimState, len(l.dims))}
	if l.start != nil {
		if t := l.start(key); t.After(now) {
			k.at = t
		}
	}
	for i := range l.dims {
		k.dims[i] = newDimState(l.startTokens(key, i, first))
	}
	if l.limits != nil {
		l.lower(k, l.limits(key))
	}
	return k
}

// startTokens returns what dimension i of a new key holds (see add).
func (l *Local) startTokens(key string, i int, first []float64) float64 {
	d := &l.dims[i]
	switch {
	case d.window():
		// Full, in a share too: empty, it would hold the fleet to its
		// refill, a day's for a daily window. But a share after another
		// takes up the last one's: a flapping Redis must not hand out a
		// day each time.
		if l.windows != nil {
			if c, ok := l.windows(key); ok {
				return min(d.limit.Burst, c[d.name])
			}
		}
		return d.limit.Burst
	case l.start != nil:
		return 0
	case l.adapt.policy.ColdStart && first != nil:
		return min(d.limit.Burst, first[i])
	case l.adapt.policy.ColdStart:
		return 0
	}
	return d.limit.Burst
}

// lower holds k, a new key, to limits, by dimension, where they are below
// its dimensions' own (windows excepted), as a provider's report that
// never ends holds a key (see dimState.rate and burst). nil changes
// nothing.
func (l *Local) lower(k *keyState, limits []Limit) {
	for i, d := range l.dims {
		if i >= len(limits) || d.window() || limits[i].Rate >= d.limit.Rate && limits[i].Burst >= d.limit.Burst {
			continue
		}
		s := &k.dims[i]
		s.reportedRate, s.reportedBurst = min(limits[i].Rate, d.limit.Rate), min(limits[i].Burst, d.limit.Burst)
		s.reportedUntil = k.at.Add(pinnedFor)
		s.tokens = min(s.tokens, s.reportedBurst)
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
		if l.learning(k, now) {
			continue // what it learnt still matters
		}
		if slices.ContainsFunc(k.dims, everReported) {
			// A report that has run its time leaves what it was owed in
			// the tokens (refill): that is owed still.
			l.refill(k, now)
		}
		if l.full(k, now) {
			delete(l.keys, name)
			if k == l.hot {
				l.hot = nil
			}
		}
	}
	l.sweepAt = max(minSweep, 2*len(l.keys))
}

// learning reports whether what k learnt still matters at now: its rate is
// below its ceiling, refusals are being counted, or a report holds one of
// its dimensions.
func (l *Local) learning(k *keyState, now time.Time) bool {
	return l.fraction(&k.law, now) < 1 || k.law.refused > 0 && now.Sub(k.law.counting) <= l.adapt.window ||
		slices.ContainsFunc(k.dims, func(s dimState) bool { return now.Before(s.reportedUntil) })
}

// everReported reports whether a report (or a share's pin) ever held s.
func everReported(s dimState) bool { return !s.reportedUntil.IsZero() }

// full reports whether k holds every dimension's burst by now, at its
// configured rate.
func (l *Local) full(k *keyState, now time.Time) bool {
	elapsed := now.Sub(k.at).Seconds()
	for i, d := range l.dims {
		if k.dims[i].tokens+elapsed*d.limit.Rate < d.limit.Burst {
			return false
		}
	}
	return true
}
