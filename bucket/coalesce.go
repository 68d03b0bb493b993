package bucket

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/wait"
)

// maxBatch is the most reservations one script call decides.
const maxBatch = 64

// maxCalls is the most calls of a key under way at once.
const maxCalls = 4

// coalescer makes the concurrent reservations of a key in this process
// share script calls (group commit), while Redis serves (the breaker is
// closed and no call has failed since the last that worked). A
// reservation of a key with fewer than maxCalls calls of that key under
// way runs at once, alone, as it would without one: a caller that does
// not queue pays a lock and a map entry. One that arrives while maxCalls
// are under way queues; when one of them returns, the queue's first
// maxBatch reservations go in one call, which the first of them makes, and
// which takes them in the order they queued (see reserveScript). So the
// more callers queue, the fewer calls per decision. With one call under
// way at most, a caller that came mid-call waited for that call and then
// its own: the transport's p50 at 8 goroutines went from 260 µs to 410 µs;
// with four, 254 µs (docs/performance.md).
//
// Each reservation of a batch is decided as if it had called alone just
// after the one before it: all or nothing with its own cost and maxWait, a
// refusal taking nothing. A batch that fails fails each of its
// reservations as a call of its own would (the fail-open share serves each,
// or each gets the error). A caller whose context ends while it queues
// leaves the queue, nothing taken; one whose context ends while its batch
// is under way gets its context's error, and what it took is refunded.
type coalescer struct {
	mu    sync.Mutex
	lanes map[string]*lane // a key's, while a call of it is under way
	free  []*lane
}

// lane is a key's queue behind its call under way.
type lane struct {
	calls  int // under way, at most maxCalls
	queued []*pending
}

// pending is a queued reservation: what it asks, and once decided, its
// outcome.
type pending struct {
	ctx     context.Context
	cost    Cost
	maxWait time.Duration
	amounts []any // per dimension of the bucket: the amount, nil if cost charges none
	// ch says, once, that the outcome is set (nil), or gives the batch
	// this reservation is the first of, to run.
	ch chan []*pending

	r     Reservation
	place []constraint
	by    server
	err   error
}

// begin reports whether a call of key may run now, and if so marks one
// under way. If not, it queues p, if p is not nil.
func (c *coalescer) begin(key string, p *pending) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.lanes[key]; l != nil {
		if l.calls < maxCalls { // then none queue
			l.calls++
			return true
		}
		if p != nil {
			l.queued = append(l.queued, p)
		}
		return false
	}
	if c.lanes == nil {
		c.lanes = make(map[string]*lane)
	}
	var l *lane
	if n := len(c.free); n > 0 {
		l, c.free = c.free[n-1], c.free[:n-1]
	} else {
		l = &lane{}
	}
	l.calls = 1
	c.lanes[key] = l
	return true
}

// next ends a call of key: it hands the next batch of key's queue to its
// first reservation to run, or, with none queued, marks no call under way.
func (c *coalescer) next(key string) {
	c.mu.Lock()
	l := c.lanes[key]
	if len(l.queued) == 0 {
		if l.calls--; l.calls > 0 {
			c.mu.Unlock()
			return
		}
		delete(c.lanes, key)
		if len(c.free) < maxBatch {
			l.queued = l.queued[:0]
			c.free = append(c.free, l)
		}
		c.mu.Unlock()
		return
	}
	n := min(len(l.queued), maxBatch)
	batch := make([]*pending, n)
	copy(batch, l.queued)
	m := copy(l.queued, l.queued[n:])
	clear(l.queued[m:])
	l.queued = l.queued[:m]
	c.mu.Unlock()
	batch[0].ch <- batch
}

// leave takes p out of key's queue, and reports whether it was there: if
// not, a batch has taken it, and its channel will say so.
func (c *coalescer) leave(key string, p *pending) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lanes[key]
	if l == nil {
		return false
	}
	for i, q := range l.queued {
		if q == p {
			n := len(l.queued)
			copy(l.queued[i:], l.queued[i+1:])
			l.queued[n-1] = nil
			l.queued = l.queued[:n-1]
			return true
		}
	}
	return false
}

// reserveBy is scripted.reserveBy with reserveScript, coalesced (see
// coalescer).
func (r *Redis) reserveBy(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, []constraint, server, error) {
	if r.single {
		return r.scripted.reserveBy(ctx, reserveScript, key, cost, maxWait, r.span, r.flags())
	}
	c := &r.co
	if c.begin(key, nil) {
		defer c.next(key)
		return r.scripted.reserveBy(ctx, reserveScript, key, cost, maxWait, r.span, r.flags())
	}
	if !r.fo.healthy() {
		// The call under way may be a probe of a Redis that failed, or
		// meet a timeout: a call queued behind it would wait for it, where
		// alone it is turned away at once (see WithRedisBreaker).
		return r.scripted.reserveBy(ctx, reserveScript, key, cost, maxWait, r.span, r.flags())
	}
	amounts, err := r.amounts(key, cost)
	if err != nil || amounts == nil {
		return Reservation{OK: err == nil}, nil, servedRedis, err
	}
	p := &pending{ctx: ctx, cost: cost, maxWait: max(maxWait, 0), amounts: amounts, ch: make(chan []*pending, 1)}
	if c.begin(key, p) { // the call under way ended meanwhile
		defer c.next(key)
		return r.scripted.reserveBy(ctx, reserveScript, key, cost, maxWait, r.span, r.flags())
	}
	var batch []*pending
	select {
	case batch = <-p.ch:
	case <-ctx.Done():
		if c.leave(key, p) {
			return Reservation{}, nil, servedRedis, fmt.Errorf("bucket: redis reserve: %w", ctx.Err())
		}
		batch = <-p.ch
	}
	if batch != nil {
		r.runBatch(key, batch)
		c.next(key)
	}
	if err := ctx.Err(); err != nil && p.err == nil {
		// Decided after the caller left: what it took goes back. The
		// refund outlives the ended context (see WaitMax).
		if p.r.OK {
			rctx, cancel := wait.Detached(ctx)
			h := scriptHead(smallAmounts[adjustUnserved], r.span, r.flags())
			rerr := r.adjustWith(rctx, adjustScript, key, cost.Neg(), false, h[:]...)
			cancel()
			if rerr != nil {
				return Reservation{}, nil, p.by, fmt.Errorf("bucket: redis reserve: %w (%w)", err, rerr)
			}
			r.waiting.fire(key, cost.Neg())
		}
		return Reservation{}, nil, p.by, fmt.Errorf("bucket: redis reserve: %w", err)
	}
	return p.r, p.place, p.by, p.err
}

// amounts returns, per dimension of r, the amount cost reserves (nil
// where none), or nil if it reserves none; or the error of a cost that
// cannot be reserved (see scripted.prepare).
func (r *Redis) amounts(key string, cost Cost) ([]any, error) {
	if key == "" {
		return nil, ErrInvalidKey
	}
	var a []any
	for i := range r.dims {
		d := &r.dims[i]
		v := cost[d.of]
		if v == 0 {
			continue
		}
		if err := d.checkCost(v); err != nil {
			return nil, err
		}
		if a == nil {
			a = make([]any, len(r.dims))
		}
		a[i] = scriptArg(v)
	}
	return a, nil
}

// runBatch decides batch, reservations of key, in one call to Redis, and
// tells each but the first (whose caller runs it) that its outcome is set.
// Those whose context has ended are left out.
func (r *Redis) runBatch(key string, batch []*pending) {
	self := batch[0]
	defer func() {
		for _, p := range batch[1:] {
			p.ch <- nil
		}
	}()
	live := make([]*pending, 0, len(batch))
	for _, p := range batch {
		if err := p.ctx.Err(); err != nil {
			p.err = fmt.Errorf("bucket: redis reserve: %w", err)
			continue
		}
		live = append(live, p)
	}
	switch len(live) {
	case 0:
		return
	case 1:
		p := live[0]
		p.r, p.place, p.by, p.err = r.scripted.reserveBy(p.ctx, reserveScript, key, p.cost, p.maxWait, r.span, r.flags())
		return
	}
	keys, args := r.batchArgs(key, live, r.flags())
	// The call is the batch's, not its first caller's: that one leaving
	// must not fail the others (each leaves by itself, see reserveBy).
	v, err := r.run(context.WithoutCancel(self.ctx), reserveScript, keys, args...).Result()
	replies, ok := v.([]any)
	if err == nil && (!ok || len(replies) != len(live)) {
		err = fmt.Errorf("unexpected reply %v", v)
	}
	for i, p := range live {
		dims := 0
		for _, a := range p.amounts {
			if a != nil {
				dims++
			}
		}
		var reply any
		if err == nil {
			reply = replies[i]
		}
		p.r, p.place, p.by, p.err = r.decided(p.ctx, key, p.cost, p.maxWait, reply, err, dims)
	}
}

// batchArgs returns the KEYS and ARGV of the reserve script for the
// reservations live of key, in order, under flags. KEYS: the state, then
// each dimension that a reservation charges. ARGV (see codec.go): the head
// with the first's maxWait, and a group per dimension key (its amount 0
// where it charges none); then for each other, its maxWait (batchWait) and
// its amount for each dimension key.
func (r *Redis) batchArgs(key string, live []*pending, flags any) ([]string, []any) {
	charged := make([]bool, len(r.dims))
	for _, p := range live {
		for i, a := range p.amounts {
			charged[i] = charged[i] || a != nil
		}
	}
	base := r.baseKey(key)
	keys := make([]string, 1, len(r.dims)+1)
	keys[0] = base
	k := 0
	for i, d := range r.dims {
		if charged[i] {
			keys = append(keys, r.dimKey(base, d.name))
			k++
		}
	}
	amount := func(p *pending, i int) any {
		if a := p.amounts[i]; a != nil {
			return a
		}
		return smallAmounts[0]
	}
	args := make([]any, 0, argHead+dimArgs*k+(len(live)-1)*(batchWait+k))
	head := scriptHead(waitArg(live[0].maxWait), r.span, flags)
	args = append(args, head[:]...)
	for i := range r.dims {
		if charged[i] {
			args = appendDim(args, &r.dims[i], r.param[i], amount(live[0], i))
		}
	}
	for _, p := range live[1:] {
		args = append(args, waitArg(p.maxWait)) // batchWait, the first of its values
		for i := range r.dims {
			if charged[i] {
				args = append(args, amount(p, i))
			}
		}
	}
	return keys, args
}
