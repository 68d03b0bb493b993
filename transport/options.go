package transport

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/wait"
)

// Option configures a Transport.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// Options is opts as one Option, applied in order: what a preset returns
// (see llmclient.OpenAI).
func Options(opts ...Option) Option {
	return optionFunc(func(c *config) {
		for _, o := range opts {
			if o != nil {
				o.apply(c)
			}
		}
	})
}

type config struct {
	bucket   bucket.Bucket
	inflight bucket.Semaphore // nil: none
	key      func(*http.Request) string
	cost     func(*http.Request) bucket.Cost
	usage    func(*http.Response) UsageMeter // nil: no reconciliation
	retry    Retry
	breaker  *gobreaker.Settings
	maxWait  time.Duration
	meters   metric.MeterProvider
	attrs    []attribute.KeyValue // on every measurement
	logger   *slog.Logger         // nil: slog.Default() at the time of logging

	// Injected by tests (export_test.go).
	now   func() time.Time
	sleep func(context.Context, time.Duration) error
	rand  func() float64
}

func newConfig(opts []Option) config {
	c := config{
		key:     HostKey,
		cost:    defaultCost,
		maxWait: bucket.Unlimited,
		now:     time.Now,
		sleep:   wait.Sleep,
		rand:    rand.Float64,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	c.retry = c.retry.withDefaults()
	return c
}

// one is the default cost, shared by every request: a Bucket must not
// modify the costs it is given.
var one = bucket.N(1)

func defaultCost(*http.Request) bucket.Cost { return one }

// WithBucket makes every attempt wait on b first. Without a bucket (the
// default) nothing is throttled: the Transport only retries, honours
// Retry-After and, with WithBreaker, breaks the circuit.
func WithBucket(b bucket.Bucket) Option {
	return optionFunc(func(c *config) {
		if b != nil {
			c.bucket = b
		}
	})
}

// WithKey sets how a request is mapped to the bucket key it is charged to.
// The default is HostKey (scheme://host); CredentialKey also tells API keys
// apart. A key must not contain a secret: hash it first (see Fingerprint).
func WithKey(f func(*http.Request) string) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.key = f
		}
	})
}

// WithCost sets what a request takes from the bucket at each attempt. The
// default is one request: bucket.N(1). The function must not read req.Body;
// it may read a copy from req.GetBody (as llmclient.RequestCost does).
func WithCost(f func(*http.Request) bucket.Cost) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.cost = f
		}
	})
}

// WithRetry sets the retry policy; zero fields keep their defaults (see
// Retry). WithRetry(Retry{MaxAttempts: 1}) disables retries. It panics if a
// field is negative (Jitter aside) or not finite, or Multiplier is below 1
// (0 aside).
func WithRetry(r Retry) Option {
	r.validate()
	return optionFunc(func(c *config) { c.retry = r })
}

// WithBreaker puts a circuit breaker (gobreaker's TwoStepCircuitBreaker,
// configured by s as it is) in front of every attempt. By default there is
// none. While it is open, RoundTrip fails at once with a *BreakerError and
// takes nothing from the bucket.
//
// The breaker is told the outcome of each attempt as an error: nil for a
// response below 500 other than 429, a *StatusError for a 429 or 5xx
// response, or the transport error. If s.IsSuccessful is nil, only nil is a
// success; if s.IsExcluded is nil, 429 responses and context cancellations
// are excluded (they neither trip nor close the breaker). s.OnStateChange is
// called as well as the Transport's own metrics and logs.
func WithBreaker(s gobreaker.Settings) Option {
	return optionFunc(func(c *config) { c.breaker = &s })
}

// WithMaxWait bounds how long one attempt may wait for the bucket (and for a
// Retry-After pause of its key); an attempt that would wait longer fails at
// once with an error that errors.Is bucket.ErrDeadline. A refusal (see
// Retry.MaxRefusals) is not retried once the request would have waited
// longer than d in all. d <= 0 (the default) means the wait is bounded
// only by the request context's deadline.
func WithMaxWait(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d <= 0 {
			d = bucket.Unlimited
		}
		c.maxWait = d
	})
}

// WithMeterProvider records the Transport's metrics through mp. By default
// metrics are not recorded.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) {
		if mp != nil {
			c.meters = mp
		}
	})
}

// WithMetricAttributes adds attrs to every measurement the Transport
// records: to tell two upstreams apart. They should be few and constant.
func WithMetricAttributes(attrs ...attribute.KeyValue) Option {
	return optionFunc(func(c *config) { c.attrs = append(c.attrs, attrs...) })
}

// WithLogger sends the Transport's logs (all at debug level) to l. By
// default they go to slog.Default(). Logs carry the method, the URL without
// its query, the attempt, the status and delays; never a header.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}
