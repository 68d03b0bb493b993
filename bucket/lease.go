package bucket

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sluicehq/sluice/adaptive"
)

// Bounds of WithLeasing.
const (
	maxLeaseCalls = 10_000
	minLeaseTTL   = 10 * time.Millisecond
	maxLeaseTTL   = time.Second
	// leaseShare is the most of a dimension's burst a lease takes: several
	// processes can hold one at once, and one can be taken at all.
	leaseShare = 0.25
)

// WithLeasing makes a Redis bucket lease tokens: a Reserve (or WaitMax)
// that finds no lease of its key, or one that holds less than its cost,
// takes in one call to Redis enough for n calls of its cost (n times its
// amount in each dimension it charges; n is k, or less where k calls would
// take more than a quarter of a dimension's burst), and this process hands
// them out to the next calls on the key with no call to Redis, until they
// run out or ttl has passed. What a lease did not hand out is given back
// to the key at ttl (an unserved refund, as Adjust's: it moves up only the
// end of the queue), or in the call that takes the next lease, or at
// Close.
//
// A lease is taken only while the key has the tokens now: not in debt,
// not paused, at the rate the fleet has learnt (every decrease and pause
// that any process observed is in what the lease call reads). Otherwise
// the call is a plain reservation, and so is every call on the key for
// the next ttl: at saturation a key gets reservations, as without leasing,
// plus one lease call per ttl. A call whose cost a lease could hold fewer
// than twice over (over a quarter of a burst) is always a plain
// reservation. A process's own Observe of a refusal (a 429 or an
// overload) drops its lease of the key without giving it back: the
// provider says the fleet is already above its limit.
//
// The cost is the fleet's bound: over any interval T, a key admits at
// most Burst + Rate*T + P*L, where P is the number of processes and L the
// most a lease holds (k times a call's cost, at most a quarter of the
// burst): a process may hand out, after a pause or a decrease that
// another process learnt, what it leased before, for at most ttl (and
// the lateness of a timer: a lease's timer, not a clock read on each
// call, ends it). A
// leased call's Reservation has Delay 0 and the lease's Epoch.
//
// It panics if k is not between 2 and 10,000 or ttl not between 10 ms
// and 1 s; 100 ms to 250 ms keeps the overshoot of a pause short. Only
// NewRedis takes it.
func WithLeasing(k int, ttl time.Duration) Option {
	if k < 2 || k > maxLeaseCalls || ttl < minLeaseTTL || ttl > maxLeaseTTL {
		panic(fmt.Sprintf("bucket: WithLeasing(%d, %v): k is between 2 and %d, ttl between %v and %v",
			k, ttl, maxLeaseCalls, minLeaseTTL, maxLeaseTTL))
	}
	return option{"WithLeasing", forRedis, func(c *config) {
		c.leasing = leaseConfig{k: k, ttl: ttl}
	}}
}

// leaseConfig is a WithLeasing; k = 0: none.
type leaseConfig struct {
	k   int
	ttl time.Duration
}

// leases are a Redis bucket's leases, one per key at most. They are safe
// for concurrent use: mu guards every field and every lease.
type leases struct {
	k      float64
	ttl    time.Duration
	mu     sync.Mutex
	keys   map[string]*lease
	closed bool
	expiry sync.WaitGroup // expire calls under way
}

// lease is what a process holds of a key: held, by dimension (as the
// bucket's dims), to hand out until until; or, until plain, nothing, and
// the key gets plain reservations. taking is non-nil while a lease call is
// under way, and closed when it is done: one at a time per key; dropped
// says a refusal came meanwhile (see drop), and the lease it takes is
// dropped too.
type lease struct {
	held    []float64
	live    bool // until has not passed: expire clears it, no clock read on the hot path
	until   time.Time
	plain   time.Time
	epoch   uint64
	taking  chan struct{}
	dropped bool
	timer   *time.Timer
}

func newLeases(c leaseConfig) *leases {
	if c.k == 0 {
		return nil
	}
	return &leases{k: float64(c.k), ttl: c.ttl, keys: make(map[string]*lease)}
}

// covers reports whether l holds cost in every dimension of dims.
func (l *lease) covers(dims []dim, cost Cost) bool {
	for i := range dims {
		if cost[dims[i].of] > l.held[i] {
			return false
		}
	}
	return true
}

// take takes cost from l, which covers it.
func (l *lease) take(dims []dim, cost Cost) {
	for i := range dims {
		l.held[i] -= cost[dims[i].of]
	}
}

// empty reports whether l holds nothing.
func (l *lease) empty() bool {
	for _, v := range l.held {
		if v > 0 {
			return false
		}
	}
	return true
}

// leaseSize returns how much a lease for cost takes in each dimension of
// dims: n calls of cost, n = k at most, and at most leaseShare of each
// dimension's burst; nil if n < 2 or cost charges nothing.
func leaseSize(dims []dim, k float64, cost Cost) []float64 {
	n := k
	charged := false
	for i := range dims {
		if v := cost[dims[i].of]; v > 0 {
			charged = true
			n = min(n, math.Floor(leaseShare*dims[i].limit.Burst/v))
		}
	}
	if !charged || n < 2 {
		return nil
	}
	size := make([]float64, len(dims))
	for i := range dims {
		size[i] = n * cost[dims[i].of]
	}
	return size
}

// leased serves cost on key from a lease, taking one if need be; ok false
// if the call must be a plain reservation, which also says what went
// wrong, if anything did (an invalid key or cost, a context done, a Redis
// that failed). It makes at most one call to Redis, and none while the
// lease holds cost.
func (r *Redis) leased(ctx context.Context, key string, cost Cost) (Reservation, bool) {
	if key == "" || !r.leasable(cost) {
		return Reservation{}, false
	}
	ls := r.leases
	for {
		ls.mu.Lock()
		if ls.closed {
			ls.mu.Unlock()
			return Reservation{}, false
		}
		l := ls.keys[key]
		if l != nil && l.live && l.covers(r.dims, cost) {
			l.take(r.dims, cost)
			res := Reservation{OK: true, Epoch: l.epoch}
			ls.mu.Unlock()
			return res, true
		}
		if l != nil && l.taking != nil {
			ch := l.taking
			ls.mu.Unlock()
			if !taken(ctx, ch) {
				return Reservation{}, false
			}
			continue
		}
		l, size, give := ls.begin(r, key, l, cost)
		ls.mu.Unlock()
		if size == nil {
			return Reservation{}, false
		}
		return r.takeAndServe(ctx, key, l, size, give, cost)
	}
}

// leasable reports whether every amount of cost is one a dimension takes
// (an invalid one is left to the plain reservation, which says why).
func (r *Redis) leasable(cost Cost) bool {
	for i := range r.dims {
		if v := cost[r.dims[i].of]; v != 0 && r.dims[i].checkCost(v) != nil {
			return false
		}
	}
	return true
}

// taken waits until ch, another call's taking of a lease, closes; false if
// ctx is done first.
func taken(ctx context.Context, ch <-chan struct{}) bool {
	done := ctx.Done()
	if done == nil {
		<-ch
		return true
	}
	select {
	case <-ch:
		return true
	case <-done:
		return false
	}
}

// begin starts taking a lease for key, whose lease is l (nil if none yet),
// with ls.mu held: it returns the lease, marked as taking, the size to take
// and what the lease held, to give back. size is nil if the call must be a
// plain reservation: the lease failed not long ago (plain), or cost is too
// large to lease.
func (ls *leases) begin(r *Redis, key string, l *lease, cost Cost) (_ *lease, size, give []float64) {
	if l != nil && time.Now().Before(l.plain) {
		return l, nil, nil
	}
	size = leaseSize(r.dims, ls.k, cost)
	if size == nil {
		return l, nil, nil
	}
	if l == nil {
		l = &lease{held: make([]float64, len(r.dims))}
		ls.keys[key] = l
		l.timer = time.AfterFunc(ls.ttl, func() { ls.expire(r, key, l) })
	}
	give = l.held
	l.held = make([]float64, len(r.dims))
	l.live, l.until = false, time.Time{}
	l.taking = make(chan struct{})
	return l, size, give
}

// takeAndServe takes l, key's lease that begin started, of size from
// Redis, giving back give, and serves cost from it; ok false if the call
// must be a plain reservation.
func (r *Redis) takeAndServe(ctx context.Context, key string, l *lease, size, give []float64, cost Cost) (Reservation, bool) {
	ls := r.leases
	got, epoch, err := r.takeLease(ctx, key, size, give)

	ls.mu.Lock()
	close(l.taking)
	l.taking = nil
	if ls.closed {
		// Close gave back what it found; this lease came after.
		ls.mu.Unlock()
		if got {
			r.giveBack(key, size)
		}
		return Reservation{}, false
	}
	end := time.Now().Add(ls.ttl)
	l.timer.Reset(ls.ttl)
	if l.dropped {
		got, l.dropped = false, false // dropped, not given back
	}
	if !got || err != nil {
		// No lease, or a Redis that failed (what it was given back is
		// lost): plain reservations for a ttl, which fail open or not.
		l.plain = end
		ls.mu.Unlock()
		return Reservation{}, false
	}
	l.held, l.live, l.until, l.epoch = size, true, end, epoch
	l.take(r.dims, cost)
	ls.mu.Unlock()
	return Reservation{OK: true, Epoch: epoch}, true
}

// expire gives back what l, key's lease, holds once its time has passed,
// and forgets it once it has no use.
func (ls *leases) expire(r *Redis, key string, l *lease) {
	ls.mu.Lock()
	if ls.closed || ls.keys[key] != l || l.taking != nil {
		ls.mu.Unlock()
		return // Close gives it back; a lease call resets the timer
	}
	now := time.Now()
	if !now.Before(l.until) {
		l.live = false
	}
	if next := later(l.until, l.plain); now.Before(next) {
		l.timer.Reset(next.Sub(now))
		ls.mu.Unlock()
		return
	}
	give := l.held
	delete(ls.keys, key)
	ls.expiry.Add(1)
	ls.mu.Unlock()
	defer ls.expiry.Done()
	r.giveBack(key, give)
}

// drop forgets key's lease without giving it back (see Observe).
func (ls *leases) drop(key string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l := ls.keys[key]; l != nil {
		clear(l.held)
		l.live, l.until = false, time.Time{}
		l.plain = time.Now().Add(ls.ttl)
		l.dropped = l.taking != nil
	}
}

// Close gives back to Redis what this process holds in leases
// (WithLeasing) and stops leasing: later calls are plain reservations.
// A bucket without leasing has nothing to close. Close is safe to call
// more than once.
func (r *Redis) Close() error {
	ls := r.leases
	if ls == nil {
		return nil
	}
	ls.mu.Lock()
	if ls.closed {
		ls.mu.Unlock()
		return nil
	}
	ls.closed = true
	give := make(map[string][]float64, len(ls.keys))
	for key, l := range ls.keys {
		l.timer.Stop()
		if !l.empty() {
			give[key] = l.held
		}
	}
	clear(ls.keys)
	ls.mu.Unlock()
	ls.expiry.Wait()
	for key, g := range give {
		r.giveBack(key, g)
	}
	return nil
}

// takeLease runs leaseScript: it gives back give and takes size on key, by
// dimension, if key has size now; got reports whether it did.
func (r *Redis) takeLease(ctx context.Context, key string, size, give []float64) (got bool, epoch uint64, err error) {
	keys := make([]string, 0, len(r.dims)+1)
	base := r.baseKey(key)
	keys = append(keys, base)
	head := scriptHead(smallAmounts[0], r.span, r.flags()) // leaseScript's argOp is unused
	args := make([]any, 0, argHead+leaseArgs*len(r.dims))
	args = append(args, head[:]...)
	for i := range r.dims {
		if size[i] == 0 && give[i] <= 0 {
			continue
		}
		d := &r.dims[i]
		keys = append(keys, r.dimKey(base, d.name))
		var g [leaseArgs]any
		g[dimKind-1], g[dimRate-1], g[dimBurst-1] = d.kind(), r.param[i], d.burst
		g[dimAmount-1], g[leaseGive-1] = scriptArg(size[i]), scriptArg(max(give[i], 0))
		args = append(args, g[:]...)
	}
	v, err := r.run(ctx, leaseScript, keys, args...).Slice()
	if err != nil {
		return false, 0, err
	}
	if len(v) != leaseReply {
		return false, 0, fmt.Errorf("bucket: redis lease: unexpected reply %v", v)
	}
	g, ok1 := v[leaseGot-1].(int64)
	e, ok2 := v[leaseEpoch-1].(int64)
	h, ok3 := v[leaseHeld-1].(int64)
	if !ok1 || !ok2 || !ok3 || e < 0 {
		return false, 0, fmt.Errorf("bucket: redis lease: unexpected reply %v", v)
	}
	r.heldLower(ctx, key, h == 1)
	return g == 1, uint64(e), nil
}

// giveBack refunds give, by dimension, to key, as an Adjust's refund (an
// unserved one: it moves up only the end of the queue). It is not
// metered: what a lease takes is counted when it is handed out. A give
// back that fails is lost: the fleet is admitted less, never more.
func (r *Redis) giveBack(key string, give []float64) {
	delta := make(Cost, len(r.dims))
	for i, d := range r.dims {
		if give[i] > 0 {
			delta[d.name] = -give[i]
		}
	}
	if len(delta) == 0 {
		return
	}
	head := scriptHead(smallAmounts[adjustUnserved], r.span, r.flags())
	argv, _, err := r.prepare(key, delta, false, true, head[:]...)
	if err != nil || argv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.fo.callTimeout())
	defer cancel()
	if r.runArgv(ctx, adjustScript, argv).Err() == nil {
		r.waiting.fire(key, delta)
	}
}

// refused reports whether fb tells of a refusal, which drops a lease.
func refused(fb adaptive.Feedback) bool {
	return fb.Class == adaptive.RateLimited || fb.Class == adaptive.Overloaded
}

// leaseScript gives back and takes a lease of each dimension key. ARGV
// (see codec.go): the head (argOp unused), then per dimension key its
// kind, rate, burst, the lease's amount and what to give back of the last
// lease. If no key is paused and each has the lease's amount
// now, net of what is given back (its own bucket and the provider's), it
// takes it; otherwise it takes nothing, and gives back. Giving back is an
// unserved refund (adjustScript's): not credited, lost during a pause. It
// replies {1 if it took the lease, else 0, the epoch, 1 if a dimension is
// held below this process's limit (see pinned), else 0}.
var leaseScript = newScript(luaCommon + `
local f, epoch = fraction()
local n = #KEYS - 1
local st, gives, ok = {}, {}, pausedTo <= now
for i = 1, n do
  local o = ARG_HEAD + LEASE_ARGS*(i-1)
  local want, give = tonumber(ARGV[o + DIM_AMOUNT]), tonumber(ARGV[o + LEASE_GIVE])
  local d = refill(KEYS[i+1], o, f, 0)
  d.tokensNow = math.min(d.burst, d.tokensNow + give)
  if d.providerNow then
    d.providerNow = math.min(d.providerBurst, d.providerNow + give)
  end
  if d.atNow > now then
    d.tokensNow = math.min(d.tokensNow, 0) -- paused: empty at its end (adjustScript)
  end
  if want > 0 and (d.atNow > now or d.tokensNow < want or (d.providerNow and d.providerNow < want)) then
    ok = false
  end
  d.amount, st[i], gives[i] = want, d, give
end
for i, d in ipairs(st) do
  if ok then
    d.tokensNow = d.tokensNow - d.amount
    if d.providerNow then d.providerNow = d.providerNow - d.amount end
    store(d)
  elseif gives[i] > 0 then
    d.pin = false -- refused: no pin (reserveScript)
    store(d)
  end
end
saveAll()
local h = 0
if held then h = 1 end
if ok then
  return {1, epoch, h} -- LEASE_GOT, LEASE_EPOCH, LEASE_HELD
end
return {0, epoch, h}
`)
