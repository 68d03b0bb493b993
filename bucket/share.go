package bucket

import (
	"context"
	"errors"
	"maps"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/wait"
)

// fallback returns the share bucket that takes a call which failed with
// err, if the bucket fails open and err is a *UnavailableError; else nil.
// The first fallback after a call that worked starts a new share bucket,
// empty; so does a change in the fleet's size.
func (f *failover) fallback(err error) *share {
	if !f.open {
		return nil
	}
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		return nil
	}
	sh := f.shareFor()
	if !brokenConn(ue.Err) && !ue.isolated {
		// A slow or refusing Redis fails every process's calls, not
		// one connection's (see failover.settle); but a call that failed
		// while a later one was served failed alone.
		sh.outage.Store(true)
	}
	return sh
}

// shareFor returns the share bucket of the outage under way, or a new one
// (see fallback).
func (f *failover) shareFor() *share {
	n := max(f.members.Load(), 1)
	if f.failing.Load() { // then the share loaded next is this outage's
		if sh := f.share.Load(); sh != nil && sh.members == n {
			return sh
		}
	}
	f.shareMu.Lock()
	defer f.shareMu.Unlock()
	old := f.share.Load()
	if old != nil && f.failing.Load() && old.members == n {
		return old // made meanwhile
	}
	// A new share starts each key after this process's slots for it, on
	// Redis and on the last share (a flapping Redis must not hand the
	// same time out twice), and owes what the last one did not settle.
	// The last share's own start, which holds the share before it, is cut
	// to Redis's slots: each share looks one back, and old ones are freed.
	start := f.slotOf
	if old != nil {
		ol := old.local
		ol.mu.Lock()
		ol.start, ol.windows = f.slotOf, nil
		ol.mu.Unlock()
		start = func(key string) time.Time {
			t := f.slotOf(key)
			if q := ol.queueEnd(key); q.After(t) {
				t = q
			}
			return t
		}
	}
	sh := newShare(f.dims, n, f.clock, f.policy, start, f.pins.of, f.windows.tokens, old)
	f.share.Store(sh)
	f.failing.Store(true) // after the store: who sees it failing finds the new share
	return sh
}

// settle debits from Redis, with debit, what this process admitted on its
// share for key while Redis was unavailable, once Redis serves key again.
// With gauge (the token bucket's, which reads key's tokens and rates on
// Redis), and if the share took a failure of the whole fleet's (the
// breaker open, a timeout, a refusal: not one connection that broke; see
// share.outage), it debits too what the rest of the
// fleet's shares are likely to have spent (see share.others): the members
// come back one at a time, and the first back must not take from Redis
// what the others are still spending on their shares.
func (f *failover) settle(ctx context.Context, debit func(context.Context, string, Cost) error, gauge gauges, key string) {
	sh := f.share.Load()
	if sh == nil || sh.owing.Load() == 0 {
		return
	}
	c, ahead := sh.take(key)
	if c == nil {
		return
	}
	// Detached: the caller's deadline, met by the call that worked,
	// must not cost the debt (it is owed again if Redis fails).
	dctx, cancel := wait.Detached(ctx)
	defer cancel()
	if err := debit(dctx, key, c); err != nil || gauge == nil || len(ahead) == 0 || sh.members < 2 || !sh.outage.Load() {
		return
	}
	tokens, rates, err := gauge(dctx, key)
	if err != nil {
		return
	}
	if extra := sh.others(ahead, tokens, rates); extra != nil {
		_ = debit(dctx, key, extra)
	}
}

// slot records that this process holds a slot of key's on Redis until t: a
// share bucket opened before then starts key after it, since the fleet's
// slots reserved on Redis go out whatever becomes of Redis. Slots that have
// passed are forgotten once the record has doubled since the last sweep.
func (f *failover) slot(key string, t time.Time) {
	f.slotsMu.Lock()
	defer f.slotsMu.Unlock()
	if f.slots == nil {
		f.slots, f.slotsSweep = make(map[string]slotSeen), minSweep
	}
	if old, ok := f.slots[key]; ok && !t.After(old.end) {
		return
	}
	now := f.clock.Now()
	if len(f.slots) >= f.slotsSweep {
		for k, u := range f.slots {
			if !u.end.After(now) {
				delete(f.slots, k)
			}
		}
		f.slotsSweep = max(minSweep, 2*len(f.slots))
	}
	f.slots[key] = slotSeen{end: t, at: now}
}

// slotSeen is the end of this process's last slot of a key on Redis, and
// when it was reserved.
type slotSeen struct{ end, at time.Time }

// slotOf returns when the fleet's slots of key on Redis end, as far as
// this process knows; the zero time if it knows none. That is the end of
// its own last slot (see slot), unless that is still to come: then the
// fleet, which kept reserving after it, holds a queue about as deep from
// now as it was then, and the end is as far from now. A share that started
// after this process's own slot gave its calls while the other processes'
// Redis slots still went out (2 to 7 429s at the upstream in
// TestFleetRedisRestart).
func (f *failover) slotOf(key string) time.Time {
	f.slotsMu.Lock()
	s := f.slots[key]
	f.slotsMu.Unlock()
	if now := f.clock.Now(); s.end.After(now) {
		return later(s.end, now.Add(s.end.Sub(s.at)))
	}
	return s.end
}

// sent reports whether a call that failed with err ran on Redis, as far as
// can be told: its connection broke after it was sent, as when its reply is
// lost, rather than the call being turned away unsent (the breaker, a
// contact under way, a refused connection, a server that did not run it)
// or timing out (a paused server drops what a client that left had sent:
// owing the call again errs toward the limit).
func sent(err error) bool {
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		return false
	}
	var ne net.Error
	if errors.As(ue.Err, &ne) && ne.Timeout() || errors.Is(ue.Err, context.DeadlineExceeded) {
		return false
	}
	return !errors.Is(ue.Err, gobreaker.ErrOpenState) && !errors.Is(ue.Err, gobreaker.ErrTooManyRequests) &&
		ue.Err != errContacting && !notRun(ue.Err)
}

// share is this process's share of a bucket's limits, when the fleet has
// members processes. It starts each key empty, and after the last slot this
// process holds for it on Redis and on the last share: what the fleet had
// left when Redis failed is not known to one process, an empty bucket never
// over-admits, and slots reserved go out whatever becomes of Redis. It
// records what it admits for each key, the debt to settle with Redis once
// it is back: what has come due (at most its burst: Redis refills no more
// while it is away) and every slot still to come; but not a call that ran
// on Redis (its reply was lost to a broken connection), which Redis has
// charged already.
type share struct {
	members int64
	local   *Local
	prev    *Local // the last share's, whose queue this one starts after

	mu    sync.Mutex
	owed  map[string]Cost
	owing atomic.Int64 // len(owed)
	// outage: the share took a call that failed as every process's calls
	// do (the breaker opened, a timeout, a refused connection; see
	// failover.settle); one whose calls failed only on connections that
	// broke (lost replies) was this process's alone.
	outage atomic.Bool
}

// newShare returns the share of a bucket with dims for one of n members: a
// Local bucket reading clk, adapting by policy, whose keys start empty, not
// before start(key), and whose debits go up to the bucket's bursts (a
// share's debt is the bucket's); owing what old did not settle. A share is
// never smaller than a Limit can be: with more members than that allows,
// each takes the least. A key the fleet held below this process's limits
// (pinned(key), by dimension; nil if not) takes its part of those. A key's
// windows start at its part of what this process saw them hold on Redis
// (seen(key, now), by window; false if it saw none), and no higher than old
// left them: a flapping Redis must not hand the same window out twice.
func newShare(dims []dim, n int64, clk Clock, policy adaptive.Policy, start func(string) time.Time, pinned func(string) []Limit, seen func(string, time.Time) (Cost, bool), old *share) *share {
	for _, d := range dims {
		n = max(1, min(n, int64(d.limit.Rate/minRate), int64(d.limit.Burst/minBurst)))
	}
	parts := make([]dim, len(dims))
	bursts := make([]float64, len(dims))
	for i, d := range dims {
		l := Limit{Rate: d.limit.Rate / float64(n), Burst: d.limit.Burst / float64(n)}
		parts[i] = newDim(d.name, d.of, l)
		bursts[i] = d.limit.Burst
	}
	s := &share{members: n, local: newLocal(parts, clk, policy, start, bursts), owed: map[string]Cost{}}
	s.local.limits = func(key string) []Limit {
		ls := pinned(key)
		if ls == nil {
			return nil
		}
		own := make([]Limit, len(ls))
		for i, l := range ls {
			own[i] = Limit{Rate: l.Rate / float64(n), Burst: l.Burst / float64(n)}
		}
		return own
	}
	s.local.windows = func(key string) (Cost, bool) {
		c, ok := seen(key, clk.Now())
		for name, v := range c {
			c[name] = v / float64(n)
		}
		if old == nil {
			return c, ok
		}
		left, had := old.local.windowTokens(key) // where the last share left them
		if !ok {
			return left, had
		}
		for name, v := range left {
			if u, ok := c[name]; !ok || v < u {
				c[name] = v
			}
		}
		return c, true
	}
	if old != nil {
		s.prev = old.local
		old.mu.Lock()
		maps.Copy(s.owed, old.owed)
		old.mu.Unlock()
		s.owing.Store(int64(len(s.owed)))
	}
	return s
}

// reserve is Reserve on the share bucket. An amount larger than the share's
// burst (but not the bucket's, which the caller checked) is reserved as the
// burst, and the rest debited once that is granted.
func (s *share) reserve(ctx context.Context, key string, cost Cost, maxWait time.Duration, owe bool) (Reservation, error) {
	var clipped, excess Cost
	for _, d := range s.local.dims {
		if v := cost[d.of]; v > d.limit.Burst {
			if clipped == nil {
				clipped, excess = maps.Clone(cost), Cost{}
			}
			if d.limit.Burst < clipped[d.of] {
				clipped[d.of], excess[d.of] = d.limit.Burst, v-d.limit.Burst
			}
		}
	}
	if clipped == nil {
		r, err := s.local.Reserve(ctx, key, cost, maxWait)
		if err == nil && r.OK && owe {
			s.owe(key, cost)
		}
		r.Epoch = outageEpoch
		return r, err
	}
	r, err := s.local.Reserve(ctx, key, clipped, maxWait)
	r.Epoch = outageEpoch
	if err != nil || !r.OK {
		return r, err
	}
	if owe {
		s.owe(key, cost)
	}
	return r, s.local.Adjust(ctx, key, excess)
}

// outageEpoch is the Epoch of a reservation a share bucket made. A refusal
// of such a request counts toward the share's decreases (it is newer than
// any of them), not toward Redis's: it is the overshoot of an outage, not a
// sign that the limit is wrong. Its pause applies everywhere.
const outageEpoch = math.MaxUint64

// adjust is Adjust on the share bucket.
func (s *share) adjust(ctx context.Context, key string, delta Cost, owe bool) error {
	if err := s.local.Adjust(ctx, key, delta); err != nil {
		return err
	}
	if owe {
		s.owe(key, delta)
	}
	return nil
}

// owe adds c to what key owes, never below zero: to each window its
// dimension's amount, or its own if c names it (a debt owed again).
func (s *share) owe(key string, c Cost) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.owed[key]
	for _, d := range s.local.dims {
		v, ok := c[d.name]
		if d.window() && !ok {
			v, ok = c[d.of] // a call's cost, which a window takes in full
		}
		if !ok {
			continue
		}
		if o == nil {
			o = make(Cost, len(s.local.dims))
		}
		o[d.name] = max(o[d.name]+v, 0)
	}
	if o != nil {
		s.owed[key] = o
		s.owing.Store(int64(len(s.owed)))
	}
}

// take returns what key owes Redis now, if anything, and forgets it: of
// what the share admitted, the slots still to come (its debt), and at most
// a burst of what has come due; by dimension and window (see prepare).
// It returns too, for each token bucket dimension with slots still to
// come, that debt and until when the slots go out (see queued).
func (s *share) take(key string) (Cost, []queued) {
	s.mu.Lock()
	o, ok := s.owed[key]
	delete(s.owed, key)
	s.owing.Store(int64(len(s.owed)))
	s.mu.Unlock()
	if !ok {
		return nil, nil
	}
	tokens := s.local.Tokens(key)
	rates := s.local.Rate(key)
	var prev Cost
	if s.prev != nil {
		prev = s.prev.Tokens(key)
	}
	var c Cost
	var ahead []queued
	for _, d := range s.local.dims {
		// A window's burst bounds what has come due of it: it has barely
		// refilled meanwhile.
		debt := max(-tokens[d.name], 0) + max(-prev[d.name], 0)
		q := min(debt, o[d.name])
		if v := q + min(max(o[d.name]-debt, 0), d.limit.Burst); v > 0 {
			if c == nil {
				c = make(Cost, len(s.local.dims))
			}
			c[d.name] = v
		}
		if q > 0 && !d.window() && rates[d.name] > 0 {
			ahead = append(ahead, queued{dim: d.name, amount: c[d.name], until: debt / rates[d.name]})
		}
	}
	return c, ahead
}

// queued is what a share owes Redis in a dimension, amount, some of it
// in slots that go out until seconds from now.
type queued struct {
	dim           string
	amount, until float64
}

// others returns what the rest of the fleet's shares are likely to owe
// Redis for a key whose share owed ahead, and which Redis, at tokens and
// rates (read after this share's debt was debited), does not hold yet; nil
// if nothing. The fleet's members share alike: each other member is taken
// to owe as much, with slots still to come until the same time. Redis
// holds it all once its queue reaches that time: so, in each dimension,
// the least of what they owe and of what Redis must lose for its queue to
// reach it. A member that comes back later debits its own again: the fleet
// is admitted less for a moment, never more.
func (s *share) others(ahead []queued, tokens, rates Cost) Cost {
	var c Cost
	for _, a := range ahead {
		tk, r := tokens[a.dim], rates[a.dim]
		if !(r >= 0 && r <= maxRate) || math.IsNaN(tk) || math.IsInf(tk, 0) { // Redis's reply, bounded
			continue
		}
		if v := min(float64(s.members-1)*a.amount, tk+r*a.until); v > 0 {
			if c == nil {
				c = make(Cost, len(ahead))
			}
			c[a.dim] = v
		}
	}
	return c
}
