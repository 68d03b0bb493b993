package bucket

import (
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
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
	fresh := !f.failing.Load() && !f.failing.Swap(true)
	n := max(f.members.Load(), 1)
	old := f.share.Load()
	if old != nil && old.members == n && !fresh {
		return old
	}
	sh := newShare(f.dims, n, append(slices.Clip(f.local), startEmpty(time.Unix(0, f.lastSlot.Load()))), old)
	if !f.share.CompareAndSwap(old, sh) {
		return f.share.Load()
	}
	return sh
}

// settle debits from the Redis bucket b what this process admitted on its
// share for key while Redis was unavailable, once Redis serves key again.
func (f *failover) settle(ctx context.Context, b Bucket, key string) {
	sh := f.share.Load()
	if sh == nil || sh.owing.Load() == 0 {
		return
	}
	if c := sh.take(key); c != nil {
		_ = b.Adjust(ctx, key, c) // at worst lost: the bucket errs toward more
	}
}

// slot records that this process holds a slot of Redis's until t: a share
// bucket opened before then starts after it, since the fleet's slots
// reserved on Redis go out whatever becomes of Redis.
func (f *failover) slot(t time.Time) {
	n := t.UnixNano()
	for {
		old := f.lastSlot.Load()
		if n <= old || f.lastSlot.CompareAndSwap(old, n) {
			return
		}
	}
}

// share is this process's share of a bucket's limits, when the fleet has
// members processes. It starts empty, and after the last slot this process
// holds on Redis: what the fleet had left when Redis failed is not known to
// one process, an empty bucket never over-admits, and the slots the fleet
// reserved on Redis are spent whatever becomes of Redis. It records what it
// admits for each key, the debt to settle with Redis once it is back: what
// has come due (at most its burst: Redis refills no more while it is away)
// and every slot still to come.
type share struct {
	members int64
	local   *Local

	mu    sync.Mutex
	owed  map[string]Cost
	owing atomic.Int64 // len(owed)
}

// newShare returns the share of a bucket with dims for one of n members,
// a Local bucket made with opts, owing what old owes.
func newShare(dims []dim, n int64, opts []Option, old *share) *share {
	part := func(l Limit) Limit { return Limit{Rate: l.Rate / float64(n), Burst: l.Burst / float64(n)} }
	opts = slices.Clip(opts)
	for _, d := range dims { // Requests too, replacing NewLocal's first argument
		opts = append(opts, WithLimit(d.name, part(d.limit)))
	}
	s := &share{members: n, local: NewLocal(part(dims[0].limit), opts...), owed: map[string]Cost{}}
	if old != nil {
		old.mu.Lock()
		maps.Copy(s.owed, old.owed)
		old.mu.Unlock()
		s.owing.Store(int64(len(s.owed)))
	}
	return s
}

// startEmpty makes a Local bucket start its keys empty, and not before t.
func startEmpty(t time.Time) Option {
	return optionFunc(func(c *config) { c.empty, c.emptyUntil = true, t })
}

// reserve is Reserve on the share bucket. An amount larger than the share's
// burst (but not the bucket's, which the caller checked) is reserved as the
// burst, and the rest debited once that is granted.
func (s *share) reserve(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, error) {
	var clipped, excess Cost
	for _, d := range s.local.dims {
		if v := cost[d.name]; v > d.limit.Burst {
			if clipped == nil {
				clipped, excess = maps.Clone(cost), Cost{}
			}
			clipped[d.name], excess[d.name] = d.limit.Burst, v-d.limit.Burst
		}
	}
	if clipped == nil {
		r, err := s.local.Reserve(ctx, key, cost, maxWait)
		if err == nil && r.OK {
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
	s.owe(key, cost)
	return r, s.local.Adjust(ctx, key, excess)
}

// outageEpoch is the Epoch of a reservation a share bucket made. A refusal
// of such a request counts toward the share's decreases (it is newer than
// any of them), not toward Redis's: it is the overshoot of an outage, not a
// sign that the limit is wrong. Its pause applies everywhere.
const outageEpoch = math.MaxUint64

// adjust is Adjust on the share bucket.
func (s *share) adjust(ctx context.Context, key string, delta Cost) error {
	if err := s.local.Adjust(ctx, key, delta); err != nil {
		return err
	}
	s.owe(key, delta)
	return nil
}

// owe adds c to what key owes, never below zero.
func (s *share) owe(key string, c Cost) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.owed[key]
	for _, d := range s.local.dims {
		v, ok := c[d.name]
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
// a burst of what has come due.
func (s *share) take(key string) Cost {
	s.mu.Lock()
	o, ok := s.owed[key]
	delete(s.owed, key)
	s.owing.Store(int64(len(s.owed)))
	s.mu.Unlock()
	if !ok {
		return nil
	}
	tokens := s.local.Tokens(key)
	var c Cost
	for _, d := range s.local.dims {
		debt := max(-tokens[d.name], 0)
		if v := min(debt, o[d.name]) + min(max(o[d.name]-debt, 0), d.limit.Burst); v > 0 {
			if c == nil {
				c = make(Cost, len(s.local.dims))
			}
			c[d.name] = v
		}
	}
	return c
}
