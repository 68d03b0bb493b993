package bucket

import (
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/law"
	"github.com/sluicehq/sluice/internal/wait"
)

// The token bucket's law: a key's state, named once, and the rules that
// change it. Each rule is a function of the state, the operation and now,
// and of nothing else: it reads no clock, takes no lock, keeps no map and
// records no metric. Local (local.go) applies the rules to its keys under
// its mutex; the Redis scripts (redis_lua.go) are their twins in Lua, and
// name the state's fields as these do.
//
// Tokens and credits are in tokens, rates in tokens per second, times on
// the bucket's clock.

// keyState is one key's whole state.
type keyState struct {
	// at is the time every dimension's tokens and provider's bucket are as
	// of: now once refilled, or later while a pause (or a share's start)
	// holds the key, and they are then what it holds at that moment. One
	// for the whole key: its dimensions are refilled, paused and reserved
	// together, so they are always as of the same time. (The scripts keep
	// one per dimension only because each dimension is a hash of its own.)
	at time.Time
	// life numbers the lives of the key's credits: unique among every
	// Local's keys when the key is made (lives), it changes when the
	// credits start again (credit) and when a provider's bucket is seeded
	// anew or folded, so that no waiter reads a credit across two lives
	// (see constraint). One for the whole key, as the credits start again
	// together.
	life uint64
	law  lawState
	dims []dimState // by dimension, in the order of tokenLaw.dims
}

// lawState is what the adaptive law has learnt of a key from refusals.
// The key's pause is its at, later than now (see keyState).
type lawState struct {
	epoch     uint64    // how many decreases so far
	after     float64   // the fraction of the ceiling (0 to 1] the last decrease cut the rate to
	decreased time.Time // when the last decrease was; zero if none
	refused   int       // refusals counted toward the next decrease
	counting  time.Time // when that count began, moved on by the pauses since
}

// dimState is one dimension's state in a key.
type dimState struct {
	tokens        float64   // the bucket's tokens as of keyState.at; negative while in debt
	reportedRate  float64   // the rate the provider reported, in tokens per second; 0 if none
	reportedBurst float64   // the burst the provider reported, in tokens; 0 if none
	reportedUntil time.Time // when reportedRate and reportedBurst stop counting (see fold); zero if no report ever held the dimension
	// provider is the provider's bucket's tokens as of keyState.at, where
	// a report gave its remaining as well as its rate and burst: it
	// refills at reportedRate up to reportedBurst. NaN if there is none.
	provider float64
	// credit is what has been added to tokens other than by time, net of
	// what has been taken other than by reservations: the refunds of calls
	// served, less every debit and every cut that a report or a pause
	// made. What the places of WaitMax's waiters rest on (see constraint).
	credit         float64
	providerCredit float64 // the same of provider
}

// tokenLaw is what the rules read besides a key's state, the operation
// and now: the bucket's dimensions, by which a key's dims are indexed,
// and its adaptive law. It never changes.
type tokenLaw struct {
	dims  []dim
	adapt adaptation
}

// lives numbers the lives of every Local's keys: a key made anew (after
// a sweep) never has the life of the one before, so no waiter reads a
// credit across the two.
var lives atomic.Uint64

// maxCredit is the most a credit holds before every credit of its key
// starts again with a new life: far from where a float64 stops counting
// millionths.
const maxCredit = 1 << 32

// newDimState returns a dimension's state holding tokens, with no report.
func newDimState(tokens float64) dimState {
	return dimState{tokens: tokens, provider: math.NaN()}
}

// hasProvider reports whether s has a provider's bucket.
func (s *dimState) hasProvider() bool { return !math.IsNaN(s.provider) }

// reported reports whether a report's rate or burst holds s (until
// s.reportedUntil, when fold ends it).
func (s *dimState) reported() bool { return s.reportedRate != 0 || s.reportedBurst != 0 }

// rate is the rate s refills at as dimension d at fraction f (which does
// not scale a window): d's, lowered to reportedRate unless the report gave
// a provider's bucket larger than d's: a constraint of its own, whose
// stored tokens a rate lowered to its refill would waste. One no larger
// than ours loses nothing so, and our bucket paced so does not send its
// refill on top of what it holds after a pause.
func (s *dimState) rate(d *dim, f float64) float64 {
	if d.window() {
		return d.limit.Rate
	}
	r := d.limit.Rate
	if s.reportedRate > 0 && (!s.hasProvider() || s.reportedBurst <= d.limit.Burst) {
		r = min(r, s.reportedRate)
	}
	return r * f
}

// burst is s's capacity as dimension d at fraction f: d's, lowered to
// reportedBurst, and scaled as the rate is, or a slowed key would gather
// the burst of its ceiling while idle.
func (s *dimState) burst(d *dim, f float64) float64 {
	if d.window() {
		return d.limit.Burst
	}
	b := d.limit.Burst
	if s.reportedBurst > 0 {
		b = min(b, s.reportedBurst)
	}
	return b * f
}

// fraction is the share of its ceiling the rate of a key with law state s
// is at now.
func (t *tokenLaw) fraction(s *lawState, now time.Time) float64 {
	if s.decreased.IsZero() {
		return 1 // inlined: most keys never decrease
	}
	return t.decreasedFraction(s, now)
}

// decreasedFraction is fraction for a key whose rate has decreased.
func (t *tokenLaw) decreasedFraction(s *lawState, now time.Time) float64 {
	return law.Fraction(t.adapt.policy, s.after, now.Sub(s.decreased), t.adapt.span)
}

// refill refills k up to now: each dimension whose report has run its
// time is folded first (fold); then over the time from at to now, tokens
// refill at rate up to burst, and provider at reportedRate up to
// reportedBurst (dimState.refill); at becomes now. A k paused past now
// keeps its tokens and its at. It returns the fraction it refilled at: k's
// at now.
func (t *tokenLaw) refill(k *keyState, now time.Time) (f float64) {
	f = t.fraction(&k.law, now)
	elapsed := now.Sub(k.at).Seconds()
	for i := range k.dims {
		if s := &k.dims[i]; f == 1 && !s.reported() {
			// What most dimensions are: at their configured rate and
			// burst (rate and burst at f = 1 with no report), with no
			// provider's bucket (a report makes it). Inlined.
			if elapsed > 0 {
				lim := &t.dims[i].limit
				s.tokens = min(s.tokens+elapsed*lim.Rate, lim.Burst)
			}
		} else {
			t.refillDim(k, i, f, elapsed, now)
		}
	}
	if elapsed > 0 {
		k.at = now
	}
	return f
}

// refillDim is refill of k's dimension i, elapsed seconds after k.at, at
// fraction f: a fold if due, then dimState.refill.
func (t *tokenLaw) refillDim(k *keyState, i int, f, elapsed float64, now time.Time) {
	s, d := &k.dims[i], &t.dims[i]
	if s.reported() && !now.Before(s.reportedUntil) {
		var newLife bool
		if *s, newLife = s.fold(d, k.at, f); newLife {
			k.life++
		}
	}
	if elapsed > 0 {
		*s = s.refill(d, f, elapsed)
	}
}

// refill refills s as dimension d at fraction f over elapsed seconds:
// tokens at rate up to burst, provider, if any, at reportedRate up to
// reportedBurst.
func (s dimState) refill(d *dim, f, elapsed float64) dimState {
	s.tokens = min(s.tokens+elapsed*s.rate(d, f), s.burst(d, f))
	if s.hasProvider() {
		s.provider = min(s.provider+elapsed*s.reportedRate, s.reportedBurst)
	}
	return s
}

// fold ends s's report, whose time ran out at reportedUntil, as dimension
// d with tokens as of at, at fraction f. The tokens refilled at the rate
// and burst it gave until reportedUntil, and hold no more then than
// provider, if any (what that was owed at its end stays owed, in ours). A
// debt then was paced at the report's rate (or the provider's bucket's):
// its slots go out until it is repaid at that pace. It is carried into
// ours at what it is worth at our rate, so that it is repaid at the same
// moment, and no call reserved after the end lands before the last of
// those slots (TestCapEndBoundsTheFleet). From reportedUntil the tokens
// refill at ours: refill adds that from at, so what it would add up to
// reportedUntil is taken off here. The report's rate and burst, and
// provider, go. It says whether there was a provider: then a new life
// starts, since no waiter's place there holds any more.
func (s dimState) fold(d *dim, at time.Time, f float64) (dimState, bool) {
	el := max(s.reportedUntil.Sub(at).Seconds(), 0)
	rc := s.rate(d, f)
	tu := min(s.tokens+el*rc, s.burst(d, f))
	pt, pr, pb, had := s.provider, s.reportedRate, s.reportedBurst, s.hasProvider()
	s.reportedRate, s.reportedBurst, s.provider = 0, 0, math.NaN()
	r := s.rate(d, f) // ours
	if tu < 0 {
		tu *= r / rc
	}
	if had {
		p := min(pt+el*pr, pb)
		if p < 0 {
			p *= r / pr
		}
		tu = min(tu, p)
	}
	s.tokens = tu - el*r
	return s, had
}

// reserve refills k up to now (refill), then takes amounts a (by
// dimension) from it if the wait for them is within maxWait: the longest
// a charged dimension takes to hold its amount in tokens and in provider
// (wait), after the pause (at, if later than now). It returns the wait,
// whether it took a, and the fraction it reckoned the rates at. A wait of
// Unlimited (292 years) takes nothing, as on Redis.
func (t *tokenLaw) reserve(k *keyState, a []float64, maxWait time.Duration, now time.Time) (w time.Duration, took bool, f float64) {
	f = t.refill(k, now)
	var secs float64 // in seconds after at
	for i, c := range a {
		// A dimension not charged is not held back by its debt; one that
		// holds c and has no provider's bucket waits for nothing.
		if s := &k.dims[i]; c != 0 && (c > s.tokens || s.hasProvider()) {
			secs = max(secs, s.wait(&t.dims[i], c, f))
		}
	}
	// Refilled, k is at now unless paused: the comparison, inlined, saves
	// the call of Sub on every reservation.
	var paused time.Duration // until at
	if k.at != now {
		paused = max(k.at.Sub(now), 0)
	}
	w = wait.Add(wait.Seconds(secs), paused)
	if w > max(maxWait, 0) || w == Unlimited {
		return w, false, f
	}
	for i, c := range a {
		s := &k.dims[i]
		s.tokens -= c
		s.provider -= c // NaN stays NaN
	}
	return w, true, f
}

// wait returns how long, in seconds after keyState.at, s takes as
// dimension d at fraction f to hold c in its tokens and in its provider's
// bucket, if any.
func (s *dimState) wait(d *dim, c, f float64) float64 {
	var secs float64
	if deficit := c - s.tokens; deficit > 0 {
		secs = deficit / s.rate(d, f)
	}
	if s.hasProvider() && c > s.provider {
		secs = max(secs, (c-s.provider)/s.reportedRate)
	}
	return secs
}

// settle refills k up to now (refill), then debits a from it (by
// dimension; a refund if negative), each amount bounded by maxDelta, the
// most one call debits or refunds. Tokens and provider go no higher than
// their bursts; a paused dimension (not a window, which no pause holds)
// no higher than 0, or what a refund gave back would go out all at once
// when the pause ends. What a debit takes is taken from the credits too;
// what a refund gives back is given to them if served (a call served gave
// it back, see dimState.credit).
func (t *tokenLaw) settle(k *keyState, a, maxDelta []float64, served bool, now time.Time) {
	f := t.refill(k, now)
	paused := k.at.After(now)
	for i := range k.dims {
		s, d := &k.dims[i], &t.dims[i]
		debit := max(min(a[i], maxDelta[i]), -maxDelta[i])
		tk := s.tokens
		s.tokens = min(s.tokens-debit, s.burst(d, f))
		if s.hasProvider() {
			pt := s.provider
			s.provider = min(pt-debit, s.reportedBurst)
			if ch := s.provider - pt; served || ch < 0 {
				k.credit(i, true, ch)
			}
		}
		if paused && !d.window() {
			s.tokens = min(s.tokens, 0)
		}
		if ch := s.tokens - tk; served || ch < 0 {
			k.credit(i, false, ch)
		}
	}
}

// credit adds v to dimension i's credit, or its providerCredit if
// provider. Beyond maxCredit, every credit of k starts again from 0, with
// a new life.
func (k *keyState) credit(i int, provider bool, v float64) {
	if v == 0 || math.IsNaN(v) {
		return
	}
	c := &k.dims[i].credit
	if provider {
		c = &k.dims[i].providerCredit
	}
	if *c += v; math.Abs(*c) > maxCredit {
		for j := range k.dims {
			k.dims[j].credit, k.dims[j].providerCredit = 0, 0
		}
		k.life++
	}
}

// millionths is a credit in millionths of a token, as a waiter's place
// holds it (see constraint).
func millionths(credit float64) int64 { return int64(math.Round(credit * 1e6)) }

// observation is what a response teaches a key, as Observe applies it.
type observation struct {
	fb      adaptive.Feedback
	reports []report      // by dimension, bounded (adaptation.report); nil if fb reported none
	rated   bool          // one of reports gives a rate
	pause   time.Duration // how long fb pauses the key (adaptation.pause); 0 if it does not
}

// observe refills k up to now (refill), then applies o to it: it counts
// a refusal and may decrease the rate (decrease), pauses k (pause),
// applies each dimension's report (report), holds the tokens to the burst
// (cap), and debits from the credits what that cut beyond time (cuts). It
// says whether it decreased the rate and whether it paused k.
func (t *tokenLaw) observe(k *keyState, o observation, now time.Time) (decreased, paused bool) {
	t.refill(k, now)
	// What it may cut from the tokens beyond time is debited from the
	// credits, against k as it is now.
	cuts := o.fb.Class != adaptive.Accepted || o.reports != nil
	var before keyState
	if cuts {
		before = *k
		before.dims = slices.Clone(k.dims)
	}
	k.law, decreased = t.decrease(k.law, o.fb, o.rated, now)
	if o.pause > 0 {
		paused = t.pause(k, now.Add(o.pause), now)
	}
	for i, r := range o.reports {
		k.dims[i] = k.dims[i].report(r, now)
	}
	t.cap(k, now)
	if cuts {
		t.cuts(k, &before, now)
	}
	return decreased, paused
}

// decrease counts fb, a response to a request reserved at some epoch, in
// law state s at now, and decreases the rate if that makes it due: when
// refusals that count (adaptation.counts) reach the threshold within the
// count's window, or one comes while the rate has held at after for the
// hold time, but never sooner than minEpoch after the last decrease. A
// decrease cuts the fraction (law.Decreased), sets decreased to now and
// starts a new epoch and a new count. A report of a rate (rated) replaces
// what refusals taught: the decrease and the count go. It says whether it
// decreased.
func (t *tokenLaw) decrease(s lawState, fb adaptive.Feedback, rated bool, now time.Time) (lawState, bool) {
	a := &t.adapt
	if rated {
		s.decreased, s.refused, s.counting = time.Time{}, 0, time.Time{}
		return s, false
	}
	if !a.counts(fb, s.epoch) {
		return s, false
	}
	if now.Sub(s.counting) > a.window {
		s.refused, s.counting = 0, now
	}
	s.refused++
	held := a.held(s.after, s.decreased, now)
	due := s.refused >= a.policy.Threshold || held > 0
	if !due || !s.decreased.IsZero() && now.Sub(s.decreased) < a.minEpoch {
		return s, false
	}
	s.after = law.Decreased(a.policy, t.fraction(&s, now), held)
	s.decreased = now
	s.epoch++
	s.refused, s.counting = 0, time.Time{} // the next refusal starts a count
	return s, true
}

// pause holds k, refilled up to now, until until, if that is later than
// its at: nothing more goes out until then, and then at the rate; every
// dimension holds at until what pauseTokens leaves it, so that what is
// reserved meanwhile is spread from then, and the slots reserved before
// keep their times. A window is not paused (it would lose what it holds,
// for its whole refill): it refills meanwhile, as provider does. The time
// paused does not count toward the refusals' window: counting moves on by
// it. It says whether it paused k.
func (t *tokenLaw) pause(k *keyState, until, now time.Time) bool {
	if !until.After(k.at) {
		return false
	}
	f := t.fraction(&k.law, now)
	d := until.Sub(k.at)
	for i := range k.dims {
		s, dm := &k.dims[i], &t.dims[i]
		if dm.window() {
			s.tokens = min(s.tokens+d.Seconds()*s.rate(dm, f), s.burst(dm, f))
			continue
		}
		s.tokens = pauseTokens(s.tokens, d, s.rate(dm, f))
		if s.hasProvider() {
			s.provider = min(s.reportedBurst, s.provider+d.Seconds()*s.reportedRate)
		}
	}
	if k.law.refused > 0 {
		k.law.counting = k.law.counting.Add(d)
	}
	k.at = until
	return true
}

// report applies r, what a response reported of the provider's limit, to
// s at now. A remaining alone (no rate, no burst) lowers provider, or the
// tokens if there is none. A rate, a burst and a remaining seed provider
// (see seed). A report of the provider's bucket that gives no rate (it is
// full) lowers provider, and the rate it last gave stands. Anything else
// caps the tokens: the rate and burst replace reportedRate and
// reportedBurst, provider goes (what it was owed stays owed, in the
// tokens), and the tokens hold no more than the remaining. The rate and
// burst hold until now plus r.until.
func (s dimState) report(r report, now time.Time) dimState {
	if r.rate == 0 && r.burst == 0 {
		return s.remaining(r.rem)
	}
	had := s.hasProvider()
	switch {
	case had && r.rate == 0 && r.rem >= 0:
		s.provider = min(s.provider, r.rem)
		if r.burst > 0 {
			s.reportedBurst = r.burst
		}
	case r.rate > 0 && r.burst > 0 && r.rem >= 0:
		s = s.seed(r)
	default:
		if had {
			s.tokens = min(s.tokens, s.provider) // what the provider's bucket was owed stays owed, in ours
		}
		s.provider = math.NaN() // caps on ours
		if r.rem >= 0 {
			s.tokens = min(s.tokens, r.rem)
		}
		s.reportedRate, s.reportedBurst = r.rate, r.burst // a report replaces the last
	}
	s.reportedUntil = now.Add(r.until)
	return s
}

// remaining lowers provider to rem, or the tokens if there is none; a
// rem below 0 is none.
func (s dimState) remaining(rem float64) dimState {
	switch {
	case rem < 0:
	case s.hasProvider():
		s.provider = min(s.provider, rem)
	default:
		s.tokens = min(s.tokens, rem)
	}
	return s
}

// seed sets s's provider's bucket from r, which reports its rate, burst
// and remaining: the remaining now, never raised by a report that may be
// older than what the fleet has spent since, but seeded anew once the
// last report has run its time (fold).
func (s dimState) seed(r report) dimState {
	if s.hasProvider() {
		s.provider = min(s.provider, r.rem)
	} else {
		s.provider = min(r.rem, r.burst)
	}
	s.reportedRate, s.reportedBurst = r.rate, r.burst
	return s
}

// cap holds every dimension's tokens of k to its burst at now.
func (t *tokenLaw) cap(k *keyState, now time.Time) {
	f := t.fraction(&k.law, now)
	for i := range k.dims {
		s := &k.dims[i]
		s.tokens = min(s.tokens, s.burst(&t.dims[i], f))
	}
}

// cuts debits from k's credits what an observe took from its tokens and
// its provider's bucket beyond time since before (k as it was, refilled
// up to the same moment), against what time alone would have left by k's
// at (the end of its pause, if it paused). A provider's bucket seeded
// anew starts a new life, with no credit.
func (t *tokenLaw) cuts(k *keyState, before *keyState, now time.Time) {
	f := t.fraction(&before.law, now)
	dt := k.at.Sub(before.at).Seconds()
	for i := range k.dims {
		s, b, d := &k.dims[i], &before.dims[i], &t.dims[i]
		if left := min(b.burst(d, f), b.tokens+dt*b.rate(d, f)); s.tokens < left {
			k.credit(i, false, s.tokens-left)
		}
		switch {
		case !s.hasProvider():
		case !b.hasProvider():
			k.life++
			s.providerCredit = 0
		default:
			if left := min(b.reportedBurst, b.provider+dt*b.reportedRate); s.provider < left {
				k.credit(i, true, s.provider-left)
			}
		}
	}
}

// place returns what a waiter's slot rests on in dimension d, for s as of
// from (wall time; later than now while paused) at fraction f: its tokens'
// and its provider bucket's constraint, each the end of its debt (when it
// is repaid), its credit and its rate, from from, in life. Without a
// provider's bucket, that constraint is not ok.
func (s *dimState) place(d *dim, f float64, from time.Time, life string) (own, prov constraint) {
	r := s.rate(d, f)
	own = constraint{ok: true, at: from.Add(wait.Seconds(max(-s.tokens, 0) / r)), from: from,
		credit: millionths(s.credit), rate: r, life: life}
	prov = constraint{from: from, life: life}
	if s.hasProvider() {
		prov = constraint{ok: true, at: from.Add(wait.Seconds(max(-s.provider, 0) / s.reportedRate)), from: from,
			credit: millionths(s.providerCredit), rate: s.reportedRate, life: life}
	}
	return own, prov
}
