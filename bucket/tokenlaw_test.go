package bucket

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/adaptive"
)

// The rules of tokenlaw.go, each applied to a state built by hand: the
// edge cases that a scenario through Local reaches only by chance.

// ruleT0 is the time the rule tests start at.
var ruleT0 = time.Unix(1000, 0)

// ruleAt is s seconds after ruleT0.
func ruleAt(s float64) time.Time { return ruleT0.Add(time.Duration(s * float64(time.Second))) }

// testLaw returns the law of requests at 10/s up to 100 (a window of the
// limit of 10 s: a count of refusals over 20 s, a decrease at most every
// 10 s), and of the windows given, under the default policy.
func testLaw(windows ...dim) *tokenLaw {
	dims := append([]dim{newDim(Requests, Requests, Limit{Rate: 10, Burst: 100})}, windows...)
	return &tokenLaw{dims: dims, adapt: newAdaptation(adaptive.DefaultPolicy(), dims)}
}

// provided returns s with a provider's bucket holding tokens, at rate up
// to burst, reported until until.
func provided(s dimState, tokens, rate, burst float64, until time.Time) dimState {
	s.provider, s.reportedRate, s.reportedBurst, s.reportedUntil = tokens, rate, burst, until
	return s
}

// assertDim checks got against want field by field, NaN equal to NaN.
func assertDim(t *testing.T, want, got dimState) {
	t.Helper()
	eq := func(name string, w, g float64) {
		if !(math.IsNaN(w) && math.IsNaN(g)) {
			assert.InDelta(t, w, g, 1e-9, name)
		}
		assert.Equal(t, math.IsNaN(w), math.IsNaN(g), "%s: %v, want %v", name, g, w)
	}
	eq("tokens", want.tokens, got.tokens)
	eq("reportedRate", want.reportedRate, got.reportedRate)
	eq("reportedBurst", want.reportedBurst, got.reportedBurst)
	assert.True(t, want.reportedUntil.Equal(got.reportedUntil), "reportedUntil: %v, want %v", got.reportedUntil, want.reportedUntil)
	eq("provider", want.provider, got.provider)
	eq("credit", want.credit, got.credit)
	eq("providerCredit", want.providerCredit, got.providerCredit)
}

// TestRefillAcrossAPauseEnd: a key paused past now keeps its tokens and
// its at; once the pause has ended it refills from the pause's end.
func TestRefillAcrossAPauseEnd(t *testing.T) {
	tl := testLaw()
	k := keyState{at: ruleAt(2), dims: []dimState{newDimState(-30)}}
	assert.Equal(t, 1.0, tl.refill(&k, ruleAt(1)))
	assert.Equal(t, -30.0, k.dims[0].tokens, "paused: nothing refills")
	assert.Equal(t, ruleAt(2), k.at)
	tl.refill(&k, ruleAt(5))
	assert.Equal(t, 0.0, k.dims[0].tokens, "3 s after the pause's end, at 10/s")
	assert.Equal(t, ruleAt(5), k.at)
	tl.refill(&k, ruleAt(20))
	assert.Equal(t, 100.0, k.dims[0].tokens, "up to the burst")
}

// TestRefillFoldsAReport: a report that has run its time is folded into
// the tokens, which refilled at its rate and burst until its end and at
// ours since; a debt then is carried into ours at what it is worth at our
// rate (repaid at the same moment); a provider's bucket holds them at its
// end, and goes with a new life.
func TestRefillFoldsAReport(t *testing.T) {
	cases := []struct {
		name    string
		s       dimState
		want    float64 // tokens 10 s after at
		newLife bool
	}{
		// 20 + 5 s at 2/s = 30 at the end, + 5 s at 10/s.
		{"tokens", dimState{tokens: 20, provider: math.NaN(), reportedRate: 2, reportedBurst: 50, reportedUntil: ruleAt(5)}, 80, false},
		// The report's burst holds them until its end: 50, + 5 s at 10/s.
		{"its burst", dimState{tokens: 45, provider: math.NaN(), reportedRate: 2, reportedBurst: 50, reportedUntil: ruleAt(5)}, 100, false},
		// -10 + 2 s at 2/s = -6 at the end, 3 s from repaid: -30 at
		// 10/s, repaid 3 s after the end too; 8 s after it, 50.
		{"a debt", dimState{tokens: -10, provider: math.NaN(), reportedRate: 2, reportedBurst: 50, reportedUntil: ruleAt(2)}, 50, false},
		// Ours at the provider's rate (its bucket is no larger than
		// ours): 40 + 5 s at 1/s, at most 20; the provider's 5 + 5 s at
		// 1/s = 10 holds them; + 5 s at 10/s.
		{"a provider's bucket", provided(dimState{tokens: 40}, 5, 1, 20, ruleAt(5)), 60, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tl := testLaw()
			k := keyState{at: ruleT0, life: 7, dims: []dimState{c.s}}
			tl.refill(&k, ruleAt(10))
			assertDim(t, dimState{tokens: c.want, provider: math.NaN(), reportedUntil: c.s.reportedUntil}, k.dims[0])
			assert.False(t, k.dims[0].reported(), "folded once")
			assert.Equal(t, c.newLife, k.life == 8, "life %d", k.life)
		})
	}
}

// TestRefillKeepsAReportThatHolds: until its end, a report's rate and
// burst hold, and the provider's bucket refills at its own.
func TestRefillKeepsAReportThatHolds(t *testing.T) {
	tl := testLaw()
	k := keyState{at: ruleT0, dims: []dimState{provided(dimState{tokens: 0}, 0, 1, 20, ruleAt(30))}}
	tl.refill(&k, ruleAt(10))
	assertDim(t, provided(dimState{tokens: 10}, 10, 1, 20, ruleAt(30)), k.dims[0])
}

// TestCreditStartsAgainAtMaxCredit: a credit beyond maxCredit starts every
// credit of the key again from 0, with a new life; none of 0 or NaN
// changes anything.
func TestCreditStartsAgainAtMaxCredit(t *testing.T) {
	k := keyState{life: 7, dims: []dimState{{credit: 5, providerCredit: -3}, {credit: 2}}}
	k.credit(0, false, 10)
	k.credit(1, true, math.NaN())
	k.credit(1, false, 0)
	assert.Equal(t, []dimState{{credit: 15, providerCredit: -3}, {credit: 2}}, k.dims)
	k.credit(1, true, maxCredit)
	assert.Equal(t, float64(maxCredit), k.dims[1].providerCredit, "at maxCredit, not beyond")
	assert.Equal(t, uint64(7), k.life)
	k.credit(1, true, 1)
	assert.Equal(t, []dimState{{}, {}}, k.dims, "every credit of the key")
	assert.Equal(t, uint64(8), k.life)
	k.credit(0, false, -maxCredit-1)
	assert.Equal(t, []dimState{{}, {}}, k.dims, "a debit too")
	assert.Equal(t, uint64(9), k.life)
}

// TestReserveRule: what reserve waits for and takes.
func TestReserveRule(t *testing.T) {
	cases := []struct {
		name     string
		at       time.Time // the key's, now being ruleT0
		s        dimState
		cost     float64
		maxWait  time.Duration
		wait     time.Duration
		took     bool
		tokens   float64
		provider float64
	}{
		{"at once", ruleT0, newDimState(5), 3, 0, 0, true, 2, math.NaN()},
		{"into debt", ruleT0, newDimState(5), 8, time.Second, 300 * time.Millisecond, true, -3, math.NaN()},
		{"beyond the wait: nothing", ruleT0, newDimState(5), 8, 299 * time.Millisecond, 300 * time.Millisecond, false, 5, math.NaN()},
		{"the provider's bucket", ruleT0, provided(dimState{tokens: 50}, 2, 1, 20, ruleAt(30)), 5, 5 * time.Second, 3 * time.Second, true, 45, -3},
		{"after the pause", ruleAt(2), newDimState(-1), 1, 3 * time.Second, 2200 * time.Millisecond, true, -2, math.NaN()},
		{"not charged: no wait", ruleAt(0), newDimState(-50), 0, 0, 0, true, -50, math.NaN()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tl := testLaw()
			k := keyState{at: c.at, dims: []dimState{c.s}}
			w, took, f := tl.reserve(&k, []float64{c.cost}, c.maxWait, ruleT0)
			assert.Equal(t, c.wait, w)
			assert.Equal(t, c.took, took)
			assert.Equal(t, 1.0, f)
			want := c.s
			want.tokens, want.provider = c.tokens, c.provider
			assertDim(t, want, k.dims[0])
		})
	}
}

// TestSettleRule: what settle gives back and takes, and what it credits.
func TestSettleRule(t *testing.T) {
	cases := []struct {
		name   string
		at     time.Time // the key's, now being ruleT0
		s      dimState
		delta  float64
		served bool
		want   dimState
	}{
		{"a served refund, up to the burst", ruleT0, newDimState(90), -30, true, dimState{tokens: 100, provider: math.NaN(), credit: 10}},
		{"a refund not served: no credit", ruleT0, newDimState(50), -30, false, dimState{tokens: 80, provider: math.NaN()}},
		{"a debit, served or not", ruleT0, newDimState(90), 5, false, dimState{tokens: 85, provider: math.NaN(), credit: -5}},
		{"at most a burst", ruleT0, newDimState(90), 500, true, dimState{tokens: -10, provider: math.NaN(), credit: -100}},
		{"paused: no higher than 0", ruleAt(1), newDimState(-20), -50, true, dimState{tokens: 0, provider: math.NaN(), credit: 20}},
		// Both up to the reported burst.
		{"the provider's bucket too", ruleT0, provided(dimState{tokens: 5}, 15, 1, 20, ruleAt(30)), -10, true,
			provided(dimState{tokens: 15, credit: 10, providerCredit: 5}, 20, 1, 20, ruleAt(30))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tl := testLaw()
			k := keyState{at: c.at, life: 7, dims: []dimState{c.s}}
			tl.settle(&k, []float64{c.delta}, []float64{100}, c.served, ruleT0)
			assertDim(t, c.want, k.dims[0])
			assert.Equal(t, c.at, k.at)
		})
	}
}

// TestDecreaseRule: refusals counted to the threshold decrease the rate
// once, no sooner than minEpoch after the last decrease; a refusal of a
// request reserved before it does not count; a reported rate forgets the
// decrease and the count.
func TestDecreaseRule(t *testing.T) {
	tl := testLaw()
	refused := adaptive.Feedback{Class: adaptive.RateLimited}
	var s lawState
	var decreased bool
	for i := range 2 {
		s, decreased = tl.decrease(s, refused, false, ruleAt(float64(i)))
		assert.False(t, decreased)
	}
	assert.Equal(t, lawState{refused: 2, counting: ruleT0}, s)
	s, decreased = tl.decrease(s, refused, false, ruleAt(2))
	assert.True(t, decreased, "the third within the count's window")
	assert.Equal(t, lawState{epoch: 1, after: 0.7, decreased: ruleAt(2)}, s)

	s, decreased = tl.decrease(s, refused, false, ruleAt(3))
	assert.False(t, decreased)
	assert.Equal(t, lawState{epoch: 1, after: 0.7, decreased: ruleAt(2)}, s, "reserved before the decrease: not counted")

	refused.Epoch = 1
	for i := range 3 {
		s, decreased = tl.decrease(s, refused, false, ruleAt(float64(4+i)))
		assert.False(t, decreased, "within minEpoch of the last decrease")
	}
	s, decreased = tl.decrease(s, refused, false, ruleAt(12))
	assert.True(t, decreased, "minEpoch after it")
	assert.InDelta(t, 0.7*(0.7+math.Pow(10.0/1200, 3)), s.after, 1e-15, "cut from where it was: 0.7, recovered for 10 s of 1200, cubic")
	assert.Equal(t, uint64(2), s.epoch)

	s.refused, s.counting = 1, ruleAt(13)
	s, decreased = tl.decrease(s, adaptive.Feedback{Class: adaptive.Accepted}, true, ruleAt(14))
	assert.False(t, decreased)
	assert.Equal(t, lawState{epoch: 2, after: s.after}, s, "a reported rate: no decrease, no count")
}

// TestPauseRule: a pause holds the key empty until its end, but for the
// debt due after it; a window refills meanwhile, as the provider's bucket
// does; the count of refusals moves on by the pause.
func TestPauseRule(t *testing.T) {
	hour := newDim("requests/1h", Requests, Limit{Rate: 1, Burst: 3600})
	tl := testLaw(hour)
	k := keyState{at: ruleT0, law: lawState{refused: 1, counting: ruleAt(-5)},
		dims: []dimState{provided(dimState{tokens: -30}, 4, 1, 20, ruleAt(30)), newDimState(100)}}
	assert.True(t, tl.pause(&k, ruleAt(2), ruleT0))
	// The debt due after the pause, at the provider's rate (its bucket is
	// no larger than ours).
	assertDim(t, provided(dimState{tokens: -28}, 6, 1, 20, ruleAt(30)), k.dims[0])
	assertDim(t, newDimState(102), k.dims[1])
	assert.Equal(t, ruleAt(2), k.at)
	assert.Equal(t, ruleAt(-3), k.law.counting)

	assert.False(t, tl.pause(&k, ruleAt(1), ruleT0), "no shorter than the pause it has")
	assert.Equal(t, ruleAt(2), k.at)

	k = keyState{at: ruleT0, dims: []dimState{newDimState(5), newDimState(100)}}
	tl.pause(&k, ruleAt(2), ruleT0)
	assert.Equal(t, 0.0, k.dims[0].tokens, "nothing more until the end")
	assert.Equal(t, time.Time{}, k.law.counting, "no count: none moved")
}

// TestReportRule: what a report does to a dimension, case by case.
func TestReportRule(t *testing.T) {
	until := 30 * time.Second
	held := ruleT0.Add(until)
	cases := []struct {
		name string
		s    dimState
		r    report
		want dimState
	}{
		{"a remaining alone lowers the tokens", newDimState(50), report{rem: 20}, newDimState(20)},
		{"a remaining alone never raises them", newDimState(10), report{rem: 20}, newDimState(10)},
		{"nothing known", newDimState(50), report{rem: -1}, newDimState(50)},
		{"a remaining alone lowers the provider's bucket", provided(dimState{tokens: 50}, 30, 1, 40, ruleAt(9)), report{rem: 20},
			provided(dimState{tokens: 50}, 20, 1, 40, ruleAt(9))},
		{"a rate, a burst and a remaining seed the provider's bucket", newDimState(50), report{rem: 60, rate: 2, burst: 40, until: until},
			provided(dimState{tokens: 50}, 40, 2, 40, held)},
		{"a seeded bucket is never raised", provided(dimState{tokens: 50}, 10, 2, 40, ruleAt(9)), report{rem: 30, rate: 2, burst: 40, until: until},
			provided(dimState{tokens: 50}, 10, 2, 40, held)},
		{"a full provider's bucket: no rate, the last stands", provided(dimState{tokens: 50}, 10, 2, 40, ruleAt(9)), report{rem: 25, burst: 45, until: until},
			provided(dimState{tokens: 50}, 10, 2, 45, held)},
		{"a limit without a remaining caps ours, owing what the provider's was", provided(dimState{tokens: 50}, 10, 2, 40, ruleAt(9)),
			report{rem: -1, rate: 3, burst: 60, until: until},
			dimState{tokens: 10, provider: math.NaN(), reportedRate: 3, reportedBurst: 60, reportedUntil: held}},
		{"a burst and a remaining cap ours", newDimState(50), report{rem: 30, burst: 60, until: until},
			dimState{tokens: 30, provider: math.NaN(), reportedBurst: 60, reportedUntil: held}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assertDim(t, c.want, c.s.report(c.r, ruleT0))
		})
	}
}

// TestCapAndCutsRules: cap holds the tokens to the burst at the fraction
// a decrease left; cuts debits from the credits what an observe took
// beyond time, and starts a new life for a provider's bucket seeded anew.
func TestCapAndCutsRules(t *testing.T) {
	tl := testLaw()
	k := keyState{at: ruleT0, life: 7, dims: []dimState{newDimState(100)}}
	before := k
	before.dims = []dimState{k.dims[0]}
	k.law = lawState{epoch: 1, after: 0.7, decreased: ruleT0}
	tl.cap(&k, ruleT0)
	assert.InDelta(t, 70, k.dims[0].tokens, 1e-9, "the burst at 0.7")
	k.dims[0] = k.dims[0].report(report{rem: 60, rate: 2, burst: 40, until: time.Minute}, ruleT0)
	tl.cuts(&k, &before, ruleT0)
	assert.InDelta(t, -30, k.dims[0].credit, 1e-9, "100 cut to 70")
	assert.Equal(t, 0.0, k.dims[0].providerCredit)
	assert.Equal(t, uint64(8), k.life, "a provider's bucket seeded anew")

	// A pause cuts against what time would have left by its end.
	k = keyState{at: ruleT0, dims: []dimState{newDimState(50)}}
	before = k
	before.dims = []dimState{k.dims[0]}
	tl.pause(&k, ruleAt(2), ruleT0)
	tl.cuts(&k, &before, ruleT0)
	assert.InDelta(t, -70, k.dims[0].credit, 1e-9, "50 + 2 s at 10/s, cut to 0")
}

// TestPlaceRule: a waiter's place in a dimension: when each bucket's debt
// is repaid, its credit in millionths, its rate, from the pause's end.
func TestPlaceRule(t *testing.T) {
	tl := testLaw()
	s := provided(dimState{tokens: -20, credit: 1.5, providerCredit: -0.25}, -3, 1, 20, ruleAt(30))
	own, prov := s.place(&tl.dims[0], 0.5, ruleAt(2), "7")
	assert.Equal(t, constraint{ok: true, at: ruleAt(42), from: ruleAt(2), credit: 1500000, rate: 0.5, life: "7"}, own, "20 at the provider's 1/s, halved")
	assert.Equal(t, constraint{ok: true, at: ruleAt(5), from: ruleAt(2), credit: -250000, rate: 1, life: "7"}, prov)
	s = newDimState(-20)
	own, prov = s.place(&tl.dims[0], 0.5, ruleT0, "7")
	assert.Equal(t, constraint{ok: true, at: ruleAt(4), from: ruleT0, rate: 5, life: "7"}, own, "20 at 5/s")
	assert.Equal(t, constraint{from: ruleT0, life: "7"}, prov, "none")
}
