package bucket

import (
	"context"
	"math"
	"sync"
	"time"
)

// Local is a Bucket kept in this process's memory: the embedded default for
// a single process, and the fallback when Redis cannot be reached. It has the
// same semantics as Redis. Local is safe for concurrent use.
type Local struct {
	dims  []dim
	clock Clock

	mu      sync.Mutex
	keys    map[string]*localKey
	sweepAt int // len(keys) at which idle keys are next removed
}

// localKey is one key's state: tokens per dimension (in the order of
// Local.dims), all refilled up to last.
type localKey struct {
	tokens []float64
	last   time.Time
}

var _ Bucket = (*Local)(nil)

// NewLocal returns an in-process bucket that limits Requests to limit, and
// each dimension given WithLimit to its own. It panics with a *LimitError if
// a limit is invalid.
func NewLocal(limit Limit, opts ...Option) *Local {
	c, dims := newConfig(limit, opts)
	return &Local{dims: dims, clock: c.clock, keys: make(map[string]*localKey), sweepAt: minSweep}
}

const minSweep = 1024

// Reserve implements Bucket.
func (l *Local) Reserve(_ context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, error) {
	for i := range l.dims {
		if err := l.dims[i].checkCost(cost[l.dims[i].name]); err != nil {
			return Reservation{}, err
		}
	}
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.advance(key, now)
	var wait float64 // seconds
	for i, d := range l.dims {
		c := cost[d.name]
		if c == 0 {
			continue // a dimension not charged is not held back by its debt
		}
		if deficit := c - k.tokens[i]; deficit > 0 {
			wait = max(wait, deficit/d.limit.Rate)
		}
	}
	w := ceilDuration(wait)
	if w > max(maxWait, 0) {
		return Reservation{RetryAfter: w}, nil
	}
	for i, d := range l.dims {
		k.tokens[i] -= cost[d.name]
	}
	return Reservation{OK: true, Delay: w}, nil
}

// Adjust implements Bucket.
func (l *Local) Adjust(_ context.Context, key string, delta Cost) error {
	for name, v := range delta {
		if err := checkDelta(name, v); err != nil {
			return err
		}
	}
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.advance(key, now)
	for i, d := range l.dims {
		k.tokens[i] = min(k.tokens[i]-delta[d.name], d.limit.Burst)
	}
	return nil
}

// Tokens returns the tokens key has now in each dimension; negative amounts
// are debt owed to reservations.
func (l *Local) Tokens(key string) Cost {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.advance(key, now)
	c := make(Cost, len(l.dims))
	for i, d := range l.dims {
		c[d.name] = k.tokens[i]
	}
	return c
}

// advance returns key's state refilled up to now, creating it full.
// l.mu must be held.
func (l *Local) advance(key string, now time.Time) *localKey {
	k, ok := l.keys[key]
	if !ok {
		l.sweep(now)
		k = &localKey{tokens: make([]float64, len(l.dims)), last: now}
		for i, d := range l.dims {
			k.tokens[i] = d.limit.Burst
		}
		l.keys[key] = k
		return k
	}
	if elapsed := now.Sub(k.last).Seconds(); elapsed > 0 {
		for i, d := range l.dims {
			k.tokens[i] = min(k.tokens[i]+elapsed*d.limit.Rate, d.limit.Burst)
		}
		k.last = now
	}
	return k
}

// sweep forgets keys that have refilled completely, once the map has grown
// to sweepAt; their state equals a new key's. l.mu must be held.
func (l *Local) sweep(now time.Time) {
	if len(l.keys) < l.sweepAt {
		return
	}
	for name, k := range l.keys {
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
		}
	}
	l.sweepAt = max(minSweep, 2*len(l.keys))
}

// ceilDuration converts seconds to a Duration, rounding up so that a waiter
// never wakes before its tokens exist.
func ceilDuration(sec float64) time.Duration {
	if sec <= 0 {
		return 0
	}
	ns := math.Ceil(sec * 1e9)
	if ns >= math.MaxInt64 {
		return Unlimited
	}
	return time.Duration(ns)
}
