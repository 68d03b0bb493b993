package bucket

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/adaptive"
)

// A key held far below its configured limit, by what a provider reported
// or by the refusals the law answered, runs at a fraction of the speed its
// user configured, and says nothing of it unless told to: a limit of 10 a
// minute that a header reports where 100 are configured makes a run ten
// times as long. A lowWarner says so, at warn level and in a counter, at
// most once every lowEvery per key.
const (
	lowFraction = 0.5                // a key held below this fraction of a configured limit is reported
	lowEvery    = time.Minute        // at most once per key in this time
	maxLowKeys  = 1024               // the keys whose last report is remembered
	byRefusals  = "refusals"         // what set a limit the law lowered
	byReport    = "a reported limit" // what set a limit a report with no header's name lowered
)

// lowLimit is a dimension held below lowFraction of its configured limit:
// what it is held to now, and by what.
type lowLimit struct {
	dim       dim
	effective Limit
	by        string // the header that reported it, or byRefusals
}

// appendLow appends to low the lowLimit that r, reported for dimension d
// in q, holds d to, if it is below lowFraction of d's configured limit.
func appendLow(low []lowLimit, d dim, r report, q adaptive.Quota) []lowLimit {
	eff := d.limit
	if r.rate > 0 {
		eff.Rate = min(eff.Rate, r.rate)
	}
	if r.burst > 0 {
		eff.Burst = min(eff.Burst, r.burst)
	}
	if !below(eff, d.limit) {
		return low
	}
	return append(low, lowLimit{dim: d, effective: eff, by: sourceOf(q)})
}

// sourceOf names what set q's limit: its header, if known.
func sourceOf(q adaptive.Quota) string {
	if q.Source == "" {
		return byReport
	}
	return q.Source
}

// lowRates returns the lowLimits of the dimensions (windows aside) whose
// rates, per second, are below lowFraction of their configured ones, after
// the law lowered them.
func lowRates(dims []dim, rates func(i int) float64) []lowLimit {
	var low []lowLimit
	for i, d := range dims {
		if d.window() {
			continue
		}
		f := rates(i) / d.limit.Rate
		eff := Limit{Rate: d.limit.Rate * f, Burst: d.limit.Burst * f}
		if below(eff, d.limit) {
			low = append(low, lowLimit{dim: d, effective: eff, by: byRefusals})
		}
	}
	return low
}

// below reports whether eff is below lowFraction of limit, in rate or burst.
func below(eff, limit Limit) bool {
	return eff.Rate < lowFraction*limit.Rate || eff.Burst < lowFraction*limit.Burst
}

// lowWarner reports the keys held low: a warning and a count per key, at
// most once every lowEvery. Safe for concurrent use; a nil *lowWarner
// reports nothing.
type lowWarner struct {
	log   *slog.Logger        // nil: slog.Default()
	label func(string) string // names a key in the log: WithMetricKeyLabel's; nil: the key
	m     *meters             // nil: no metrics

	mu sync.Mutex
	at map[string]time.Time // when each key was last reported
}

func newLowWarner(log *slog.Logger, label func(string) string, m *meters) *lowWarner {
	return &lowWarner{log: log, label: label, m: m, at: make(map[string]time.Time)}
}

// due reports whether key may be reported at now.
func (w *lowWarner) due(key string, now time.Time) bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	last, ok := w.at[key]
	return !ok || now.Sub(last) >= lowEvery
}

// warn reports key held to low at now, unless it was within lowEvery. The
// keys remembered are bounded: those reported longer ago than lowEvery are
// forgotten when the map is full, and while it stays full of recent ones a
// new key is not reported.
func (w *lowWarner) warn(key string, low []lowLimit, now time.Time) {
	if w == nil || len(low) == 0 || !w.take(key, now) {
		return
	}
	name := key
	if w.label != nil {
		name = w.label(key)
	}
	log := w.log
	if log == nil {
		log = slog.Default()
	}
	for _, l := range low {
		log.LogAttrs(context.Background(), slog.LevelWarn,
			"sluice: a key is held below half its configured limit: calls on it go slower than configured",
			slog.String("key", name), slog.String("dimension", l.dim.name),
			slog.String("configured", perMinute(l.dim.limit)), slog.String("effective", perMinute(l.effective)),
			slog.String("by", l.by))
		w.m.held(key, l)
	}
}

// take notes key reported at now, if it is due and there is room.
func (w *lowWarner) take(key string, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if last, ok := w.at[key]; ok && now.Sub(last) < lowEvery {
		return false
	}
	if len(w.at) >= maxLowKeys {
		for k, t := range w.at {
			if now.Sub(t) >= lowEvery {
				delete(w.at, k)
			}
		}
		if len(w.at) >= maxLowKeys {
			return false
		}
	}
	w.at[key] = now
	return true
}

// perMinute writes l per minute, as providers state their limits:
// "10/min burst 10".
func perMinute(l Limit) string {
	return strconv.FormatFloat(l.Rate*60, 'g', 4, 64) + "/min burst " + strconv.FormatFloat(l.Burst, 'g', 4, 64)
}

// held counts a key found held to l.
func (m *meters) held(key string, l lowLimit) {
	if m == nil {
		return
	}
	lb := m.of(key)
	for i, d := range m.dims {
		if d.name == l.dim.name {
			m.low.Add(context.Background(), 1, lb.dimAdd[i]...)
		}
	}
}
