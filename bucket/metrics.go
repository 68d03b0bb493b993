package bucket

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Instrument names. No attribute carries a key unless WithMetricKeyLabel
// says how to label one.
const (
	meterName         = "github.com/sluicehq/sluice/bucket"
	metricDecisions   = "sluice.bucket.decisions"         // counter: Reserve calls, by decision and by what served them
	metricCharged     = "sluice.bucket.tokens.charged"    // counter, by dimension: what reservations took
	metricRefunded    = "sluice.bucket.tokens.refunded"   // counter, by dimension: what Adjust gave back
	metricDebited     = "sluice.bucket.tokens.debited"    // counter, by dimension: what Adjust took on top
	metricWait        = "sluice.bucket.wait.duration"     // histogram, s: the delay of each reservation taken
	metricWaiters     = "sluice.bucket.waiters"           // gauge: reservations whose slot has not come
	metricDecreases   = "sluice.bucket.rate.decreases"    // counter: rate decreases this process's Observe made
	metricPauses      = "sluice.bucket.pauses"            // counter: pauses this process's Observe set or lengthened
	metricRemaining   = "sluice.bucket.tokens.remaining"  // gauge, by dimension: the tokens of the last key used
	metricFraction    = "sluice.bucket.rate.fraction"     // gauge, by dimension: its rate over the configured one
	metricRedisState  = "sluice.bucket.redis.state"       // gauge: 0 serving, 1 failing open, 2 failing closed, 3 misconfigured
	metricTransitions = "sluice.bucket.redis.transitions" // counter: outages begun and ended, by the state entered
	metricMembers     = "sluice.bucket.members"           // gauge: the fleet's live members, as last counted
	metricLow         = "sluice.bucket.limit.low"         // counter, by dimension: keys found held below half its configured limit

	attrDecision  = "decision"
	attrServedBy  = "served_by"
	attrDimension = "dimension"
	attrKey       = "key"
	attrState     = "state"

	// maxLabels bounds the key labels a bucket records; the keys of the
	// labels beyond are recorded under otherLabel.
	maxLabels  = 32
	otherLabel = "other"
	// gaugeTimeout bounds the reads of a collection.
	gaugeTimeout = time.Second
)

// WithMeterProvider makes a bucket record its metrics through mp's meter
// "github.com/sluicehq/sluice/bucket": its decisions, the tokens charged,
// refunded and debited by dimension, the delays it handed out and the
// reservations still waiting, the rate decreases and pauses it applied,
// and, as gauges read when they are collected, the tokens and the rate
// fraction of the last key used (one read of Redis per label each
// collection) and, for a Redis-backed bucket, Redis's state and the
// fleet's membership count. docs/signals.md lists them. By default a bucket
// records nothing. No measurement carries a key unless WithMetricKeyLabel
// says how to label keys, so that a thousand keys make no more series than
// one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return option{"WithMeterProvider", forAll, func(c *config) { c.metrics.provider = mp }}
}

// WithMetricAttributes adds attrs to every measurement the bucket records:
// to tell two upstreams or two buckets apart. They should be few and
// constant.
func WithMetricAttributes(attrs ...attribute.KeyValue) Option {
	return option{"WithMetricAttributes", forAll, func(c *config) {
		c.metrics.attrs = append(c.metrics.attrs, attrs...)
	}}
}

// WithMetricKeyLabel labels each measurement with label(key) as the
// attribute "key", and keeps the gauges of the last key used under each
// label. At most 32 labels are recorded: the keys of any label beyond them
// are recorded as "other". label must be fast and safe for concurrent
// use, and should map many keys to one label (a model, a tenant's tier),
// never return a credential or a raw key that holds one.
func WithMetricKeyLabel(label func(key string) string) Option {
	return option{"WithMetricKeyLabel", forAll, func(c *config) { c.metrics.label = label }}
}

// decision is what became of one Reserve.
type decision int

const (
	decidedNow     decision = iota // taken, no wait
	decidedDelayed                 // taken, for a later slot
	decidedRefused                 // nothing taken: the wait was beyond maxWait
	decidedError                   // an error
	numDecisions
)

var decisionNames = [numDecisions]string{"now", "delayed", "refused", "error"}

// server is what served a call.
type server int

const (
	servedLocal server = iota // a Local bucket
	servedRedis               // Redis
	servedShare               // this process's share, failing open
	numServers
)

var serverNames = [numServers]string{"local", "redis", "share"}

// gauges reads a bucket's state for the gauges: a key's tokens and
// rate by dimension (rates nil if it does not adapt).
type gauges func(ctx context.Context, key string) (tokens, rates Cost, err error)

// meters are a bucket's instruments; a nil *meters records nothing.
type meters struct {
	dims   []dim
	static []attribute.KeyValue
	label  func(string) string
	read   gauges
	fo     *failover // nil: not Redis-backed

	decisions, charged, refunded, debited metric.Float64Counter
	decreases, pauses, transitions, low   metric.Int64Counter
	wait                                  metric.Float64Histogram

	one    *labelled // when label is nil
	mu     sync.Mutex
	labels map[string]*labelled

	waiting waiters
	entered map[string]metric.MeasurementOption // by the state a transition enters
}

// labelled is what a meters keeps for one key label: its attribute sets,
// precomputed, and the last key used under it.
type labelled struct {
	base metric.MeasurementOption
	dim  []metric.MeasurementOption // by dimension
	last atomic.Pointer[string]
	// The options as the slices the instruments take, so that a call
	// passes them without a slice of its own.
	decided [numDecisions][numServers][]metric.AddOption
	dimAdd  [][]metric.AddOption // by dimension
	baseAdd []metric.AddOption
	waited  []metric.RecordOption
}

// metricsConfig is what the options say about metrics.
type metricsConfig struct {
	provider metric.MeterProvider // nil: none
	attrs    []attribute.KeyValue
	label    func(string) string
}

// newMeters returns c's instruments for a bucket of dims whose gauges read
// is read; nil if c has no meter provider.
func newMeters(c metricsConfig, dims []dim, read gauges, fo *failover) *meters {
	if c.provider == nil {
		return nil
	}
	m := &meters{dims: dims, static: c.attrs, label: c.label, read: read, fo: fo,
		labels: make(map[string]*labelled)}
	mt := c.provider.Meter(meterName)
	m.newInstruments(mt)
	m.newTransitions(fo)
	if m.label == nil {
		m.one = m.newLabelled("", false)
	}
	m.registerGauges(mt, fo)
	return m
}

// newInstruments makes m's counters and its histogram of waits through mt;
// one that mt refuses is a no-op one.
func (m *meters) newInstruments(mt metric.Meter) {
	m.decisions = float64Counter(mt, metricDecisions, "{decision}", "Reservations asked for, by decision (now, delayed, refused, error) and by what served them (local, redis, share).")
	m.charged = float64Counter(mt, metricCharged, "{token}", "Tokens that reservations took, by dimension.")
	m.refunded = float64Counter(mt, metricRefunded, "{token}", "Tokens that Adjust gave back (a cancelled wait, usage below the estimate), by dimension.")
	m.debited = float64Counter(mt, metricDebited, "{token}", "Tokens that Adjust charged on top of the reservation (usage above the estimate), by dimension.")
	m.decreases = int64Counter(mt, metricDecreases, "{decrease}", "Rate decreases that this process's refusals made.")
	m.pauses = int64Counter(mt, metricPauses, "{pause}", "Pauses of a key that this process's responses set or lengthened.")
	m.low = int64Counter(mt, metricLow, "{report}", "Keys found held below half a dimension's configured limit by a provider's report or by refusals, at most once a minute per key: when a warning is logged (WithLogger).")
	m.transitions = int64Counter(mt, metricTransitions, "{transition}", "Redis outages begun (state fail_open or fail_closed) and ended (state serving).")
	var err error
	if m.wait, err = mt.Float64Histogram(metricWait, metric.WithUnit("s"),
		metric.WithDescription("The delay of each reservation taken: how long its caller waits for its slot."),
		metric.WithExplicitBucketBoundaries(0, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60)); err != nil {
		m.wait, _ = noop.Meter{}.Float64Histogram(metricWait)
	}
}

// float64Counter returns mt's Float64Counter name, or a no-op one if mt
// refuses it.
func float64Counter(mt metric.Meter, name, unit, desc string) metric.Float64Counter {
	i, err := mt.Float64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	if err != nil {
		i, _ = noop.Meter{}.Float64Counter(name)
	}
	return i
}

// int64Counter returns mt's Int64Counter name, or a no-op one if mt
// refuses it.
func int64Counter(mt metric.Meter, name, unit, desc string) metric.Int64Counter {
	i, err := mt.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	if err != nil {
		i, _ = noop.Meter{}.Int64Counter(name)
	}
	return i
}

// newTransitions keeps the attributes of each state a transition of Redis
// enters, and, for a Redis-backed bucket (fo not nil), starts the counts of
// the transitions it can make at zero.
func (m *meters) newTransitions(fo *failover) {
	m.entered = map[string]metric.MeasurementOption{}
	for _, name := range []string{"serving", "fail_open", "fail_closed"} {
		m.entered[name] = m.with(attribute.String(attrState, name))
	}
	if fo == nil {
		return
	}
	down := "fail_closed"
	if fo.open {
		down = "fail_open"
	}
	m.transitions.Add(context.Background(), 0, m.entered[down])
	m.transitions.Add(context.Background(), 0, m.entered["serving"])
}

// registerGauges makes m's gauges through mt (Redis's state and the
// fleet's members too for a Redis-backed bucket, fo not nil) and registers
// the callback that reads them at each collection. If mt refuses one, m
// records its counters only.
func (m *meters) registerGauges(mt metric.Meter, fo *failover) {
	waiters, err1 := mt.Int64ObservableGauge(metricWaiters, metric.WithUnit("{reservation}"),
		metric.WithDescription("Reservations this process holds whose slot has not come yet."))
	remaining, err2 := mt.Float64ObservableGauge(metricRemaining, metric.WithUnit("{token}"),
		metric.WithDescription("Tokens of the last key used (under each key label), by dimension; negative: owed to reservations."))
	fraction, err3 := mt.Float64ObservableGauge(metricFraction, metric.WithUnit("1"),
		metric.WithDescription("The refill rate of the last key used (under each key label) over the configured rate, by dimension: below 1 after a decrease or a lower limit the provider reported."))
	insts := []metric.Observable{waiters, remaining, fraction}
	var state, members metric.Int64ObservableGauge
	var err4, err5 error
	if fo != nil {
		state, err4 = mt.Int64ObservableGauge(metricRedisState,
			metric.WithDescription("Redis as the bucket sees it: 0 serving, 1 unavailable and failing open (calls take this process's share), 2 unavailable and failing closed, 3 misconfigured."))
		members, err5 = mt.Int64ObservableGauge(metricMembers, metric.WithUnit("{process}"),
			metric.WithDescription("The fleet's live processes, as last counted (failing open: each takes a share of the limit in an outage)."))
		insts = append(insts, state, members)
	}
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || err5 != nil {
		return // counters only: the meter refused a gauge
	}
	_, _ = mt.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		o.ObserveInt64(waiters, m.waiting.count(time.Now()), m.baseOption())
		m.observeKeys(ctx, o, remaining, fraction)
		if fo != nil {
			m.observeFailover(o, fo, state, members)
		}
		return nil
	}, insts...)
}

// observeFailover observes Redis's state as fo sees it and, if fo fails
// open, the fleet's members as last counted (none before the first count).
func (m *meters) observeFailover(o metric.Observer, fo *failover, state, members metric.Int64Observable) {
	o.ObserveInt64(state, int64(fo.metricState()), m.baseOption())
	if fo.open {
		if n := fo.members.Load(); n > 0 {
			o.ObserveInt64(members, n, m.baseOption())
		}
	}
}

// with is the static attributes and attrs, as one set.
func (m *meters) with(attrs ...attribute.KeyValue) metric.MeasurementOption {
	all := make([]attribute.KeyValue, 0, len(m.static)+len(attrs))
	all = append(all, m.static...)
	all = append(all, attrs...)
	return metric.WithAttributeSet(attribute.NewSet(all...))
}

func (m *meters) newLabelled(label string, keyed bool) *labelled {
	var extra []attribute.KeyValue
	if keyed {
		extra = []attribute.KeyValue{attribute.String(attrKey, label)}
	}
	l := &labelled{base: m.with(extra...), dim: make([]metric.MeasurementOption, len(m.dims))}
	for d := range numDecisions {
		for s := range numServers {
			l.decided[d][s] = []metric.AddOption{m.with(append(extra[:len(extra):len(extra)],
				attribute.String(attrDecision, decisionNames[d]), attribute.String(attrServedBy, serverNames[s]))...)}
		}
	}
	l.dimAdd = make([][]metric.AddOption, len(m.dims))
	for i, d := range m.dims {
		l.dim[i] = m.with(append(extra[:len(extra):len(extra)], attribute.String(attrDimension, d.name))...)
		l.dimAdd[i] = []metric.AddOption{l.dim[i]}
	}
	l.baseAdd = []metric.AddOption{l.base}
	l.waited = []metric.RecordOption{l.base}
	// The counters start at zero, so that a rate of them is one from the
	// start.
	ctx := context.Background()
	for _, o := range l.dim {
		m.charged.Add(ctx, 0, o)
		m.refunded.Add(ctx, 0, o)
		m.debited.Add(ctx, 0, o)
		m.low.Add(ctx, 0, o)
	}
	m.decreases.Add(ctx, 0, l.base)
	m.pauses.Add(ctx, 0, l.base)
	return l
}

// baseOption is the attributes of the measurements that carry no key.
func (m *meters) baseOption() metric.MeasurementOption {
	if m.one != nil {
		return m.one.base
	}
	return m.with()
}

// of returns key's label's record, noting key as its last.
func (m *meters) of(key string) *labelled {
	l := m.one
	if l == nil {
		name := m.label(key)
		m.mu.Lock()
		if l = m.labels[name]; l == nil {
			if len(m.labels) >= maxLabels {
				name = otherLabel
				l = m.labels[name]
			}
			if l == nil {
				l = m.newLabelled(name, true)
				m.labels[name] = l
			}
		}
		m.mu.Unlock()
	}
	if p := l.last.Load(); p == nil || *p != key {
		k := key // only a new key escapes
		l.last.Store(&k)
	}
	return l
}

// reserved records a Reserve of cost from key; its wait is counted among
// the waiters until its slot, unless counted reports that the caller
// counts it (see waiters.sleep).
func (m *meters) reserved(key string, cost Cost, r Reservation, err error, by server, counted bool) {
	if m == nil {
		return
	}
	ctx := context.Background()
	l := m.of(key)
	d := decidedNow
	switch {
	case err != nil:
		d = decidedError
	case !r.OK:
		d = decidedRefused
	case r.Delay > 0:
		d = decidedDelayed
	}
	m.decisions.Add(ctx, 1, l.decided[d][by]...)
	if err != nil || !r.OK {
		return
	}
	for i, dm := range m.dims {
		if v := cost[dm.of]; v > 0 {
			m.charged.Add(ctx, v, l.dimAdd[i]...)
		}
	}
	m.wait.Record(ctx, r.Delay.Seconds(), l.waited...)
	if r.Delay > 0 && !counted {
		m.waiting.add(time.Now().Add(r.Delay))
	}
}

// adjusted records an Adjust of key by delta that worked. A debit is
// counted as taken: at most a burst.
func (m *meters) adjusted(key string, delta Cost) {
	if m == nil {
		return
	}
	ctx := context.Background()
	l := m.of(key)
	for i, dm := range m.dims {
		switch v := delta[dm.of]; {
		case v < 0:
			m.refunded.Add(ctx, -v, l.dimAdd[i]...)
		case v > 0:
			m.debited.Add(ctx, min(v, dm.limit.Burst), l.dimAdd[i]...)
		}
	}
}

// observed records what an Observe of key changed: a rate decrease, a
// pause set or lengthened.
func (m *meters) observed(key string, decreased, paused bool) {
	if m == nil || !decreased && !paused {
		return
	}
	l := m.of(key)
	if decreased {
		m.decreases.Add(context.Background(), 1, l.baseAdd...)
	}
	if paused {
		m.pauses.Add(context.Background(), 1, l.baseAdd...)
	}
}

// transition records an outage's start (failing open or closed) or end.
func (m *meters) transition(state string) {
	if m == nil {
		return
	}
	m.transitions.Add(context.Background(), 1, m.entered[state])
}

// observeKeys observes the gauges of the last key of each label.
func (m *meters) observeKeys(ctx context.Context, o metric.Observer, remaining, fraction metric.Float64Observable) {
	if m.fo != nil && m.fo.metricState() != 0 {
		return // no read of a Redis that is not serving
	}
	ls := []*labelled{m.one}
	if m.one == nil {
		m.mu.Lock()
		ls = ls[:0]
		for _, l := range m.labels {
			ls = append(ls, l)
		}
		m.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(ctx, gaugeTimeout)
	defer cancel()
	for _, l := range ls {
		p := l.last.Load()
		if p == nil {
			continue
		}
		tokens, rates, err := m.read(ctx, *p)
		if err != nil {
			continue
		}
		for i, d := range m.dims {
			o.ObserveFloat64(remaining, tokens[d.name], l.dim[i])
			if rates != nil {
				o.ObserveFloat64(fraction, rates[d.name]/d.limit.Rate, l.dim[i])
			}
		}
	}
}

// waiters are the times at which this process's reservations' slots come,
// for those to come: a min-heap, pruned as they pass; and the waits of
// WaitMax under way, which end when their slot moves up or they are
// cancelled.
type waiters struct {
	mu       sync.Mutex
	due      dueHeap
	sleeping atomic.Int64
}

// waiters returns m's waiters gauge, or nil if m is (no metrics).
func (m *meters) waiters() *waiters {
	if m == nil {
		return nil
	}
	return &m.waiting
}

// sleep counts a WaitMax's wait, n = 1 as it begins and -1 as it ends. w
// may be nil (no metrics).
func (w *waiters) sleep(n int64) {
	if w != nil {
		w.sleeping.Add(n)
	}
}

func (w *waiters) add(at time.Time) {
	w.mu.Lock()
	w.prune(time.Now())
	heap.Push(&w.due, at.UnixNano())
	w.mu.Unlock()
}

// count returns how many slots come after now.
func (w *waiters) count(now time.Time) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prune(now)
	return int64(len(w.due)) + w.sleeping.Load()
}

func (w *waiters) prune(now time.Time) {
	for n := now.UnixNano(); len(w.due) > 0 && w.due[0] <= n; {
		heap.Pop(&w.due)
	}
}

type dueHeap []int64

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
