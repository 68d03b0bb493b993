package bucket

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/adaptive"
)

// Redis is a Bucket shared through a Redis server (single node, Sentinel or
// Cluster): every operation is one Lua script, atomic, timed by the server's
// clock only. All dimensions of a key live in one hash slot, so a cost over
// several dimensions is taken all or nothing. Redis is safe for concurrent
// use.
type Redis struct {
	scripted
	adapt  adaptation
	span   any // adapt.span in microseconds, formatted
	co     coalescer
	leases *leases // nil: no leasing (WithLeasing)
	low    *lowWarner
}

var _ Bucket = (*Redis)(nil)

// NewRedis returns a bucket stored in rdb that limits Requests to limit, and
// each dimension given WithLimit to its own. It makes no call to Redis. It
// panics with a *LimitError if a limit is invalid, and if an option is not
// one NewRedis takes (WithLease, say, NewInFlight's): the panic names the
// option and the constructors that take it.
//
// Every process that charges a key should give it the same limits. Where
// they differ (a rollout, a mistake), they are never mixed: a key's state
// records the lowest rate and the lowest burst that a process has used it
// with within a hold (the limit's refill time, 1 to 60 s), and those hold
// for every process; a process held below its own limits logs a warning at
// most once a minute (WithLogger). A lowered limit so takes effect at once,
// and a raised one once no process has used the old one for a hold. Only a
// reservation that takes something records its limits: a refused one holds
// nobody. A waiter whose slot was reckoned at a lower limit reads it again
// when that limit's hold lapses (see WaitMax), so the fleet is back at its
// own limit within a hold of the last use of the lower one. A limit more
// than 1000 times below or above a process's own is a configuration error
// (a unit or a typo), not a limit: it holds neither process to the other,
// and each logs it at error level at most once a minute.
func NewRedis(rdb redis.UniversalClient, limit Limit, opts ...Option) *Redis {
	r := &Redis{scripted: newScripted(rdb, forRedis, "NewRedis", limit, opts, "", tokenParam)}
	r.state = true
	r.debit = func(ctx context.Context, key string, c Cost) error {
		h := scriptHead(smallAmounts[adjustUnserved], r.span, r.flags())
		return r.adjustWith(ctx, adjustScript, key, c, true, h[:]...)
	}
	r.gauge = r.gauges
	r.adapt = newAdaptation(r.policy, r.dims)
	r.span = scriptArg(float64(r.adapt.span.Microseconds()))
	r.meter(r.gauges)
	r.low = newLowWarner(r.fo.log, r.metrics.label, r.m)
	r.waiting = &refunds{}
	r.leases = newLeases(r.leasing)
	if slices.ContainsFunc(r.dims, dim.window) {
		r.fo.windows = newWindowsSeen(r.dims)
		r.fo.windows.lower = r.lowerWindows
	}
	return r
}

// lowerWindows lowers key's windows to the amounts in to, where they hold
// more (see windowsSeen), with one call to Redis.
func (r *Redis) lowerWindows(ctx context.Context, key string, to Cost) error {
	base := r.baseKey(key)
	keys := []string{base}
	h := scriptHead(smallAmounts[0], r.span, r.adapt.flags()) // lowerScript's argOp is unused
	args := h[:]
	for i := range r.dims {
		d := &r.dims[i]
		if v, ok := to[d.name]; ok && d.window() {
			keys = append(keys, r.dimKey(base, d.name))
			args = appendDim(args, d, r.param[i], scriptArg(v))
		}
	}
	return r.run(ctx, lowerScript, keys, args...).Err()
}

func (r *Redis) refunds() *refunds { return r.waiting }

// tokenParam is the scripts' number for a token bucket's dimension: its
// rate (its kind, a window or not, is an argument of its own: dimKind).
func tokenParam(d dim) any {
	return scriptArg(d.limit.Rate)
}

// Reserve implements Bucket with one call to Redis (or none, if cost charges
// no limited dimension or a lease holds it: see WithLeasing). Concurrent
// reservations of a key from this process share calls: those that arrive
// while one of the key is under way are decided together, in order, in
// the next (see coalescer).
func (r *Redis) Reserve(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, error) {
	if r.leases != nil {
		if res, ok := r.leased(ctx, key, cost); ok {
			r.m.reserved(key, cost, res, nil, servedRedis, false)
			return res, nil
		}
	}
	res, _, by, err := r.reserveBy(ctx, key, cost, maxWait)
	r.m.reserved(key, cost, res, err, by, false)
	return res, err
}

// Adjust implements Bucket with one call to Redis.
func (r *Redis) Adjust(ctx context.Context, key string, delta Cost) error {
	h := scriptHead(smallAmounts[adjustUnserved], r.span, r.flags())
	return r.adjust(ctx, adjustScript, key, delta, h[:]...)
}

// Settle implements Settler with one call to Redis: a refund moves up
// every waiter (see the package function Settle).
func (r *Redis) Settle(ctx context.Context, key string, delta Cost) error {
	h := scriptHead(smallAmounts[adjustServed], r.span, r.flags())
	return r.adjust(ctx, adjustScript, key, delta, h[:]...)
}

// reserveAt implements moveUp: Reserve for WaitMax, which counts its wait
// among the waiters itself; the slot may move up unless a fail-open share
// served it, whose reservations Redis does not hold. A lease serves it as
// it does Reserve.
func (r *Redis) reserveAt(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, slotMove, error) {
	if r.leases != nil {
		if res, ok := r.leased(ctx, key, cost); ok {
			r.m.reserved(key, cost, res, nil, servedRedis, true)
			return res, slotMove{}, nil
		}
	}
	res, place, by, err := r.reserveBy(ctx, key, cost, maxWait)
	r.m.reserved(key, cost, res, err, by, true)
	return res, slotMove{movable: by != servedShare, place: place}, err
}

// earliest implements moveUp with one call to Redis: the places of the
// end of key's queue in each dimension cost charges.
func (r *Redis) earliest(ctx context.Context, key string, cost Cost) (queue, error) {
	now := time.Now()
	h := scriptHead(smallAmounts[0], r.span, r.flags()) // queueScript's argOp is unused
	argv, dims, err := r.prepare(key, cost, true, false, h[:]...)
	if err != nil || argv == nil {
		return queue{end: now}, err
	}
	v, err := r.runArgv(ctx, queueScript, argv).Slice()
	if err != nil {
		return queue{}, err
	}
	cons, err := places(v, time.Now())
	if err != nil || len(cons) != 2*dims {
		return queue{}, fmt.Errorf("bucket: redis queue: unexpected reply %v", v)
	}
	q := queue{end: now, cons: cons}
	for _, c := range cons {
		if c.ok {
			q.end = later(q.end, c.at)
		}
	}
	return q, nil
}

// flags are the law's flags, with a cold start for keys that Redis does
// not have during an outage and just after (see WithFailOpen).
func (r *Redis) flags() any {
	if r.fo.cold() {
		return r.adapt.flagsCold()
	}
	return r.adapt.flags()
}

// Tokens returns the tokens key has now in each dimension; negative amounts
// are debt owed to reservations.
func (r *Redis) Tokens(ctx context.Context, key string) (Cost, error) {
	tokens, _, err := r.gauges(ctx, key)
	return tokens, err
}

// gauges returns key's tokens and rates now.
func (r *Redis) gauges(ctx context.Context, key string) (tokens, rates Cost, err error) {
	h := scriptHead(smallAmounts[0], r.span, r.adapt.flags()) // tokensScript's argOp is unused
	return r.tokens(ctx, tokensScript, key, h[:]...)
}

// Observe implements Bucket with one call to Redis (none if fb is empty),
// atomic for every dimension of key.
func (r *Redis) Observe(ctx context.Context, key string, fb adaptive.Feedback) error {
	if fb.Empty() {
		return nil
	}
	if key == "" {
		return ErrInvalidKey
	}
	if r.leases != nil && refused(fb) {
		r.leases.drop(key)
	}
	believed := false  // a quota that a dimension keeps
	var low []lowLimit // dimensions a report holds low
	keys := make([]string, 0, len(r.dims)+1)
	base := r.baseKey(key)
	keys = append(keys, base)
	head := r.observeHead(fb)
	args := make([]any, 0, obsHead+obsArgs*len(r.dims))
	args = append(args, head[:]...)
	for i := range r.dims {
		d := &r.dims[i]
		keys = append(keys, r.dimKey(base, d.name))
		rp := report{rem: -1}
		if q, ok := fb.Quotas[d.name]; ok && !d.window() { // a report speaks of the dimension's own limit
			rp = r.adapt.report(q, d.limit)
		}
		if rp.rate > 0 {
			args[obsVerdict-1] = smallAmounts[verdictForget] // forget what refusals taught
		}
		believed = believed || rp.says()
		low = appendLow(low, *d, rp, fb.Quotas[d.name])
		args = appendObserved(args, d, r.param[i], rp)
	}
	args[obsPause-1] = scriptArg(float64(r.adapt.pause(fb, believed).Microseconds()))
	changed, err := r.run(ctx, observeScript, keys, args...).Int64()
	if err != nil {
		if sh := r.fo.fallback(err); sh != nil {
			return sh.local.Observe(ctx, key, fb)
		}
		return fmt.Errorf("bucket: redis observe: %w", err)
	}
	r.m.observed(key, changed&observedDecrease != 0, changed&observedPause != 0)
	r.warnLow(ctx, key, low, changed&observedDecrease != 0)
	r.waiting.accepted(key, fb)
	return nil
}

// observeHead is the head of observeScript's ARGV for fb (see codec.go),
// but for the pause, which the reports decide (Observe sets it).
func (r *Redis) observeHead(fb adaptive.Feedback) [obsHead]any {
	p := &r.adapt.policy
	var h [obsHead]any
	h[obsVerdict-1] = smallAmounts[verdictNone] // nothing to learn from refusals
	if fb.Class == adaptive.RateLimited && fb.Epoch != outageEpoch {
		h[obsVerdict-1] = smallAmounts[verdictCount] // a refusal to count
	}
	h[argSpan-1], h[argFlags-1] = r.span, r.adapt.flags()
	h[obsEpoch-1] = scriptArg(float64(min(fb.Epoch, 1<<53)))
	h[obsDecrease-1], h[obsFloor-1] = scriptArg(p.Decrease), scriptArg(p.Floor)
	h[obsMinEpoch-1] = scriptArg(float64(r.adapt.minEpoch.Microseconds()))
	h[obsThreshold-1] = scriptArg(float64(p.Threshold))
	h[obsWindow-1] = scriptArg(float64(r.adapt.window.Microseconds()))
	h[obsHold-1] = scriptArg(float64(r.adapt.hold.Microseconds()))
	return h
}

// appendObserved appends to args the group of dimension d of
// observeScript's ARGV (see codec.go), whose scripts' number is param,
// with what rp reports of it.
func appendObserved(args []any, d *dim, param any, rp report) []any {
	var g [obsArgs]any
	g[dimKind-1], g[dimRate-1], g[dimBurst-1] = d.kind(), param, d.burst
	g[obsRemaining-1], g[obsReportedRate-1] = scriptArg(rp.rem), scriptArg(rp.rate)
	g[obsReportedBurst-1] = scriptArg(rp.burst)
	g[obsReportedFor-1] = scriptArg(float64(rp.until.Microseconds()))
	return append(args, g[:]...)
}

// warnLow reports key held low, if that is due: by a report (low), or,
// after a decrease, by the law (a read of its rates).
func (r *Redis) warnLow(ctx context.Context, key string, low []lowLimit, decreased bool) {
	now := time.Now()
	if !r.low.due(key, now) || len(low) == 0 && !decreased {
		return
	}
	if len(low) == 0 {
		_, rates, err := r.gauges(ctx, key)
		if err != nil {
			return
		}
		low = lowRates(r.dims, func(i int) float64 { return rates[r.dims[i].name] })
	}
	r.low.warn(key, low, now)
}
