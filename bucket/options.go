package bucket

import (
	"github.com/sluicehq/sluice/adaptive"

	"sort"
	"time"
)

// Option configures a bucket at construction.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	limits map[string]Limit
	clock  Clock
	prefix string
	policy adaptive.Policy
	redis  redisPolicy // failover.go
	// Local, as a share (share.go): keys start empty, not before start(key);
	// debits go up to maxDebit, by dimension
	start    func(key string) time.Time
	maxDebit map[string]float64
}

// Clock tells the time. The Local backend reads it; Redis backends use the
// server's clock only, except in the Local bucket they fall back to while
// Redis is down (WithFailOpen).
type Clock interface{ Now() time.Time }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// WithLimit limits dimension dim as well. The Limit given to the
// constructor is the Requests dimension's; WithLimit(Requests, l) replaces it.
func WithLimit(dim string, l Limit) Option {
	return optionFunc(func(c *config) { c.limits[dim] = l })
}

// WithClock makes the Local backend, and the fallback of a Redis-backed one,
// read time from clk (nil: the system clock). Tests use it to control
// refills.
func WithClock(clk Clock) Option {
	return optionFunc(func(c *config) {
		if clk != nil {
			c.clock = clk
		}
	})
}

// WithPrefix sets the first part of the Redis keys, "sluice" by default:
// keys are <prefix>:{<key>}:<dimension>.
func WithPrefix(p string) Option {
	return optionFunc(func(c *config) {
		if p != "" {
			c.prefix = p
		}
	})
}

// WithPolicy sets the law by which a token bucket adapts its rate to
// throttled responses (Observe); adaptive.DefaultPolicy by default. It
// panics with an error wrapping adaptive.ErrInvalidPolicy if p is invalid.
func WithPolicy(p adaptive.Policy) Option {
	return optionFunc(func(c *config) {
		if err := p.Validate(); err != nil {
			panic(err)
		}
		c.policy = p.WithDefaults()
	})
}

// newConfig applies opts over the defaults and validates the limits. It
// panics with a *LimitError on an invalid limit: limits are program
// configuration; check ones that come from input with Limit.Validate first.
func newConfig(requests Limit, opts []Option) (config, []dim) {
	c := config{limits: map[string]Limit{Requests: requests}, clock: systemClock{}, prefix: "sluice", policy: adaptive.DefaultPolicy()}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	dims := make([]dim, 0, len(c.limits))
	for name, l := range c.limits {
		if err := l.Validate(); err != nil {
			le := err.(*LimitError)
			le.Dim = name
			panic(le)
		}
		if name == "" {
			panic(&LimitError{Limit: l, Reason: "dimension name is empty"})
		}
		dims = append(dims, dim{
			name:  name,
			limit: l,
			burst: scriptArg(l.Burst),
		})
	}
	sort.Slice(dims, func(i, j int) bool { return dims[i].name < dims[j].name })
	return c, dims
}
