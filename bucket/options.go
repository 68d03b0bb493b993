package bucket

import (
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/law"
	"github.com/sluicehq/sluice/internal/wait"
)

// Option configures a bucket at construction. Each option says which
// constructors take it; given to another, it makes that one panic rather
// than be ignored.
type Option interface{ apply(*config) }

// backends is a set of the constructors an option is for.
type backends uint8

const (
	forLocal  backends = 1 << iota // NewLocal
	forRedis                       // NewRedis
	forWindow                      // NewFixedWindow, NewSlidingLog
	forFlight                      // NewInFlight
	forStored = forRedis | forWindow
	forAll    = forLocal | forStored
	forShared = forStored | forFlight // what Redis serves
)

// names are the constructors in b, for errors.
func (b backends) names() string {
	var n []string
	for _, x := range []struct {
		b    backends
		name string
	}{{forLocal, "NewLocal"}, {forRedis, "NewRedis"}, {forWindow, "NewFixedWindow, NewSlidingLog"}, {forFlight, "NewInFlight"}} {
		if b&x.b != 0 {
			n = append(n, x.name)
		}
	}
	return strings.Join(n, ", ")
}

// option is an Option for the constructors in its set.
type option struct {
	name string
	set  backends
	f    func(*config)
}

func (o option) apply(c *config) {
	if o.set&c.backend == 0 {
		c.refused = append(c.refused, o.name+" (an option of "+o.set.names()+")")
		return
	}
	o.f(c)
}

type config struct {
	backend backends // the one being made
	refused []string // options not for it
	limits  map[string]Limit
	clock   Clock
	prefix  string
	policy  adaptive.Policy
	windows []window
	redis   redisPolicy   // failover.go
	metrics metricsConfig // metrics.go
	lease   time.Duration // NewInFlight's; 0: defaultLease
	single  bool          // WithoutCoalescing
	leasing leaseConfig   // NewRedis's (lease.go)
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
	return option{"WithLimit", forAll, func(c *config) { c.limits[dim] = l }}
}

// WithWindow limits dimension dim over a longer window as well, such as
// PerDay(10_000) beside PerMinute(500): every call takes its amount of dim
// from each of dim's windows, all or nothing, and waits for the one that
// refills last. A window is exact: the adaptive law neither cuts nor
// pauses it, and the provider's reports (which speak of the dimension's
// own limit) leave it alone; so a per-minute refusal costs the day nothing.
// Its state lasts two of its lengths after its last write, two days for a
// daily window (longer than it takes to refill, so that a window that
// expired was full and every process's record of it has refilled).
// Each process remembers what Redis last said a key's window held, refilled
// since: a window that Redis lost (a restart, a flush) and made anew full is
// lowered back to that by the first call that finds it new, and an outage's
// share starts at its part of it; a process that has not used the key, or
// leases it (WithLeasing), remembers nothing. In Redis,
// Tokens and the metrics it is the dimension "<dim>/<its length>", such as
// "requests/24h0m0s". dim must be limited (the constructor's Requests, or
// WithLimit). It panics with a *LimitError if l is invalid.
func WithWindow(dim string, l Limit) Option {
	return option{"WithWindow", forAll, func(c *config) {
		c.windows = append(c.windows, window{dim, l})
	}}
}

// window is a WithWindow.
type window struct {
	of    string
	limit Limit
}

// WithClock makes the Local backend, and the fallback of a Redis-backed one,
// read time from clk (nil: the system clock). Tests use it to control
// refills.
func WithClock(clk Clock) Option {
	return option{"WithClock", forAll, func(c *config) {
		if clk != nil {
			c.clock = clk
		}
	}}
}

// WithPrefix sets the first part of a Redis-backed bucket's keys, "sluice"
// by default: keys are <prefix>:{<key>}:<dimension> (an InFlight's,
// <prefix>:{<key>}/inflight).
func WithPrefix(p string) Option {
	return option{"WithPrefix", forShared, func(c *config) {
		if p != "" {
			c.prefix = p
		}
	}}
}

// WithPolicy sets the law by which a token bucket (Local, Redis) adapts its
// rate to throttled responses (Observe); adaptive.DefaultPolicy by default.
// The window buckets do not adapt, and do not take it. It panics with an
// error wrapping adaptive.ErrInvalidPolicy if p is invalid.
func WithPolicy(p adaptive.Policy) Option {
	return option{"WithPolicy", forLocal | forRedis, func(c *config) {
		if err := p.Validate(); err != nil {
			panic(err)
		}
		c.policy = law.WithDefaults(p)
	}}
}

// WithoutCoalescing makes a Redis bucket send each reservation in a call
// of its own. By default, the reservations of a key that arrive while a
// call of that key is under way in this process wait for it and then go
// together in one call, each decided exactly as if it had called alone
// (see Redis.Reserve): under contention, fewer calls per decision and
// more decisions per second (BenchmarkRedis in compat/bucket:
// docs/performance.md gives the figures); alone, no different.
func WithoutCoalescing() Option {
	return option{"WithoutCoalescing", forRedis, func(c *config) { c.single = true }}
}

// newConfig applies opts over the defaults for backend, made by the
// constructor named ctor, and validates the limits. It panics with a
// *LimitError on an invalid limit (limits are program configuration; check
// ones that come from input with Limit.Validate first), and if an option is
// not for backend.
func newConfig(backend backends, ctor string, requests Limit, opts []Option) (config, []dim) {
	c := config{backend: backend, limits: map[string]Limit{Requests: requests}}
	c.applyOptions(ctor, opts)
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
		dims = append(dims, newDim(name, name, l))
	}
	for _, w := range c.windows {
		if err := w.limit.Validate(); err != nil {
			le := err.(*LimitError)
			le.Dim = w.of
			panic(le)
		}
		if _, ok := c.limits[w.of]; !ok {
			panic(&LimitError{Dim: w.of, Limit: w.limit, Reason: "a window of a dimension that has no limit (give it WithLimit)"})
		}
		name := w.of + "/" + wait.Seconds(w.limit.Burst/w.limit.Rate).String()
		if slices.ContainsFunc(dims, func(d dim) bool { return d.name == name }) {
			panic(&LimitError{Dim: w.of, Limit: w.limit, Reason: "a second window of the same length"})
		}
		dims = append(dims, newDim(name, w.of, w.limit))
	}
	sort.Slice(dims, func(i, j int) bool { return dims[i].name < dims[j].name })
	return c, dims
}

// applyOptions applies opts over the defaults, for the constructor named
// ctor; it panics if an option is not for c.backend.
func (c *config) applyOptions(ctor string, opts []Option) {
	c.clock, c.prefix, c.policy = systemClock{}, "sluice", adaptive.DefaultPolicy()
	for _, o := range opts {
		if o != nil {
			o.apply(c)
		}
	}
	if len(c.refused) > 0 {
		panic("bucket: " + ctor + " does not take " + strings.Join(c.refused, ", "))
	}
}
