package transport

import (
	"context"
	"strconv"
	"time"

	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Instrument names. Attributes never carry a header, a URL or a key.
const (
	meterName      = "github.com/sluicehq/sluice/transport"
	metricWait     = "sluice.transport.wait.duration" // histogram, s: time an attempt waited before it was sent
	metricAttempts = "sluice.transport.attempts"      // counter: attempts by outcome
	metricRetries  = "sluice.transport.retries"       // counter: retries by reason
	metricBreaker  = "sluice.transport.breaker.state" // gauge: 0 closed, 1 half-open, 2 open
	// histogram: attempts one request made, retries included
	metricRequestAttempts = "sluice.transport.request.attempts"
	// histogram, s: time one request waited in all, before its attempts and between them
	metricRequestWait = "sluice.transport.request.wait.duration"
	attrOutcome       = "outcome"
	attrReason        = "reason"
	attrBreakerName   = "breaker"
)

// outcome is what became of one attempt.
type outcome int

const (
	outcomeOK           outcome = iota // a response below 400
	outcomeClientError                 // 4xx other than 429
	outcomeThrottled                   // 429
	outcomeServerError                 // 5xx
	outcomeError                       // no response: a connection error
	outcomeCanceled                    // the request's context ended first
	outcomeBreakerOpen                 // refused by the circuit breaker
	outcomeWaitExceeded                // its slot lay past the deadline or max wait
	outcomeBucketError                 // the bucket or the in-flight semaphore failed (e.g. Redis unreachable)
	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	"ok", "client_error", "throttled", "server_error", "error",
	"canceled", "breaker_open", "wait_exceeded", "bucket_error",
}

func (o outcome) String() string { return outcomeNames[o] }

func responseOutcome(code int) outcome {
	switch {
	case code == 429:
		return outcomeThrottled
	case code >= 500:
		return outcomeServerError
	case code >= 400:
		return outcomeClientError
	}
	return outcomeOK
}

type metrics struct {
	static   []attribute.KeyValue
	base     metric.MeasurementOption
	wait     metric.Float64Histogram
	attempts metric.Int64Counter
	retries  metric.Int64Counter
	breaker  metric.Int64Gauge
	reqTries metric.Int64Histogram
	reqWait  metric.Float64Histogram
	outcome  [numOutcomes]metric.AddOption // precomputed: no allocation per attempt
}

// newMetrics returns the instruments of mp, recording static on every
// measurement; nil (no metrics) if mp is nil. The methods of a nil
// *metrics do nothing.
func newMetrics(mp metric.MeterProvider, static []attribute.KeyValue) *metrics {
	if mp == nil {
		return nil
	}
	m := mp.Meter(meterName)
	nm := noop.Meter{}
	var err error
	ms := &metrics{static: static}
	ms.base = ms.with()
	if ms.wait, err = m.Float64Histogram(metricWait, metric.WithUnit("s"),
		metric.WithDescription("Time an attempt waited for an in-flight slot, the bucket and Retry-After pauses before it was sent."),
		metric.WithExplicitBucketBoundaries(0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)); err != nil {
		ms.wait, _ = nm.Float64Histogram(metricWait)
	}
	if ms.attempts, err = m.Int64Counter(metricAttempts, metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts made, retries included, by outcome.")); err != nil {
		ms.attempts, _ = nm.Int64Counter(metricAttempts)
	}
	if ms.retries, err = m.Int64Counter(metricRetries, metric.WithUnit("{retry}"),
		metric.WithDescription("Retries scheduled, by the status code that caused them or \"error\".")); err != nil {
		ms.retries, _ = nm.Int64Counter(metricRetries)
	}
	if ms.breaker, err = m.Int64Gauge(metricBreaker,
		metric.WithDescription("Circuit breaker state: 0 closed, 1 half-open, 2 open.")); err != nil {
		ms.breaker, _ = nm.Int64Gauge(metricBreaker)
	}
	if ms.reqTries, err = m.Int64Histogram(metricRequestAttempts, metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts one request made, retries included, by the time RoundTrip returned."),
		metric.WithExplicitBucketBoundaries(0, 1, 2, 3, 5, 10, 20)); err != nil {
		ms.reqTries, _ = nm.Int64Histogram(metricRequestAttempts)
	}
	if ms.reqWait, err = m.Float64Histogram(metricRequestWait, metric.WithUnit("s"),
		metric.WithDescription("Time one request waited in all: for in-flight slots, the bucket and Retry-After pauses before its attempts, and between its attempts."),
		metric.WithExplicitBucketBoundaries(0, 0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300)); err != nil {
		ms.reqWait, _ = nm.Float64Histogram(metricRequestWait)
	}
	for o := range numOutcomes {
		ms.outcome[o] = ms.with(attribute.String(attrOutcome, o.String()))
	}
	return ms
}

// with is the static attributes and attrs, as one set.
func (m *metrics) with(attrs ...attribute.KeyValue) metric.MeasurementOption {
	all := make([]attribute.KeyValue, 0, len(m.static)+len(attrs))
	all = append(all, m.static...)
	all = append(all, attrs...)
	return metric.WithAttributeSet(attribute.NewSet(all...))
}

func (m *metrics) attempt(ctx context.Context, o outcome) {
	if m == nil {
		return
	}
	m.attempts.Add(ctx, 1, m.outcome[o])
}

func (m *metrics) waited(ctx context.Context, d time.Duration) {
	if m == nil {
		return
	}
	m.wait.Record(ctx, d.Seconds(), m.base)
}

// request records what one request came to: its attempts, and the time
// it waited in all.
func (m *metrics) request(ctx context.Context, attempts int, waited time.Duration) {
	if m == nil {
		return
	}
	m.reqTries.Record(ctx, int64(attempts), m.base)
	m.reqWait.Record(ctx, waited.Seconds(), m.base)
}

func (m *metrics) retry(ctx context.Context, code int) {
	if m == nil {
		return
	}
	reason := "error"
	if code != 0 {
		reason = strconv.Itoa(code)
	}
	m.retries.Add(ctx, 1, m.with(attribute.String(attrReason, reason)))
}

func (m *metrics) breakerState(name string, s gobreaker.State) {
	if m == nil {
		return
	}
	m.breaker.Record(context.Background(), int64(s), m.with(attribute.String(attrBreakerName, name)))
}
