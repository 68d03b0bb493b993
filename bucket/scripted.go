package bucket

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/adaptive"
)

// scripted is what the Redis-backed buckets share: the client, the
// dimensions, each with the number its scripts read first (the token
// bucket's rate, a window's length), the key layout, and the failure
// policy (failover.go).
type scripted struct {
	rdb    redis.UniversalClient
	dims   []dim
	param  []any // per dimension, formatted
	prefix string
	suffix string // after the dimension: one key type per algorithm
	state  bool   // the scripts' KEYS[1] is the key's adaptive state
	policy adaptive.Policy
	fo     *failover
	// debit debits a share's debt (see failover.settle) with the backend's
	// adjust script, whole.
	debit func(ctx context.Context, key string, c Cost) error
	// gauge reads a key's tokens and rates on Redis, for a share's
	// settlement (see failover.settle): the token bucket's; nil in others.
	gauge   gauges
	metrics metricsConfig
	m       *meters  // nil: no metrics
	waiting *refunds // of the token bucket's waiters (WaitMax)
	single  bool     // WithoutCoalescing
	last    *lastNames
	pinLog  *pinLog

	leasing leaseConfig // WithLeasing (NewRedis only)
}

func newScripted(rdb redis.UniversalClient, backend backends, ctor string, limit Limit, opts []Option, suffix string, param func(dim) any) scripted {
	c, dims := newConfig(backend, ctor, limit, opts)
	if strings.ContainsAny(c.prefix, "{}") {
		panic(fmt.Sprintf("bucket: prefix %q holds a brace: it would choose the Cluster hash slot", c.prefix))
	}
	s := scripted{rdb: rdb, dims: dims, param: make([]any, len(dims)), prefix: c.prefix, suffix: suffix,
		policy: c.policy, fo: newFailover(rdb, c, dims), metrics: c.metrics, single: c.single, leasing: c.leasing,
		last: &lastNames{}, pinLog: &pinLog{}}
	for i, d := range dims {
		s.param[i] = param(d)
	}
	return s
}

// meter makes s's instruments, whose gauges read.
func (s *scripted) meter(read gauges) {
	s.m = newMeters(s.metrics, s.dims, read, s.fo)
	s.fo.m = s.m
}

// baseKey is <prefix>:{<key>}, key as keyTag writes it: the name of key's
// adaptive state, and the start of its dimensions' names. The braces put
// every name of a key in one Cluster hash slot.
func (s *scripted) baseKey(key string) string {
	return s.prefix + ":{" + keyTag(key) + "}"
}

// dimKey is the name of a dimension of the key whose baseKey is base:
// <base>:<dim><suffix>.
func (s *scripted) dimKey(base, dim string) string {
	return base + ":" + dim + s.suffix
}

// prepare builds the argv of a script call (see scriptArgv) for the
// dimensions cost charges: KEYS are key's adaptive state (if s.state) and
// each such dimension's, ARGV is head, then each one's group (see
// group). It says how many dimension keys there are; with none, argv is nil.
// With reserve, amounts are checked against the limits; else a debit or a
// refund is cut to a burst, unless whole: a share's debt, which names each window's
// amount (share.take), where other costs give a window its dimension's.
func (s *scripted) prepare(key string, cost Cost, reserve, whole bool, head ...any) (argv []any, dims int, err error) {
	if key == "" {
		return nil, 0, ErrInvalidKey
	}
	var names []any
	state := s.stateKeys()
	for i := range s.dims {
		d := &s.dims[i]
		v, ok := cost[d.of]
		if whole && d.window() {
			v, ok = cost[d.name] // a share's debt says each window's (share.take)
		}
		if !ok || v == 0 {
			continue
		}
		if reserve {
			if err := d.checkCost(v); err != nil {
				return nil, 0, err
			}
		} else if err := checkDelta(d.name, v); err != nil {
			return nil, 0, err
		} else if !whole {
			v = max(min(v, d.limit.Burst), -d.limit.Burst) // a debit or a refund is at most a burst (see Bucket.Adjust)
		}
		if argv == nil {
			// Room for every dimension's key: ARGV moves down over what
			// is left unused.
			names = s.names(key)
			argv = make([]any, argvHead+state+len(s.dims), argvHead+state+len(s.dims)+len(head)+dimArgs*len(s.dims))
			if s.state {
				argv[argvHead] = names[0]
			}
			argv = append(argv, head...)
		}
		argv[argvHead+state+dims] = names[1+i]
		dims++
		argv = s.group(argv, i, scriptArg(v))
	}
	if argv == nil {
		return nil, 0, nil
	}
	if unused := len(s.dims) - dims; unused > 0 {
		at := argvHead + state + dims
		argv = argv[:at+copy(argv[at:], argv[at+unused:])]
	}
	argv[2] = state + dims
	return argv, dims, nil
}

// group appends to argv the group of dimension i of a script's ARGV,
// charged amount: with the adaptive state (s.state), the token bucket
// scripts', laid out by the codec (appendDim); else the window scripts':
// param, burst and amount.
func (s *scripted) group(argv []any, i int, amount any) []any {
	if s.state {
		return appendDim(argv, &s.dims[i], s.param[i], amount)
	}
	return append(argv, s.param[i], s.dims[i].burst, amount)
}

// lastNames holds the names of the key named last (see scripted.names).
type lastNames struct{ atomic.Pointer[keyNames] }

// keyNames are a key's names as script arguments (see scripted.names).
type keyNames struct {
	key   string
	names []any
}

// names returns key's names as script arguments: its baseKey, then each
// dimension's dimKey. Those of the key named last are kept, so that the
// calls of a hot key make none: a process that alternates keys makes them
// each time, as it would without.
func (s *scripted) names(key string) []any {
	if n := s.last.Load(); n != nil && n.key == key {
		return n.names
	}
	base := s.baseKey(key)
	names := make([]any, 1+len(s.dims))
	names[0] = base
	for i, d := range s.dims {
		names[1+i] = s.dimKey(base, d.name)
	}
	s.last.Store(&keyNames{key: key, names: names})
	return names
}

// unlimitedArg is Unlimited as a script's maxWait, formatted once.
var unlimitedArg = scriptArg(float64(Unlimited.Microseconds()))

// waitArg is maxWait as a reserve script reads it: whole microseconds, at
// least 0.
func waitArg(maxWait time.Duration) any {
	if maxWait == Unlimited {
		return unlimitedArg
	}
	return scriptArg(float64(max(maxWait, 0).Microseconds()))
}

// reserve runs a reserve script, whose ARGV are maxWait in microseconds,
// extra, then the groups of prepare. The script replies with the wait in
// microseconds, negated if it took nothing (a refused wait is always > 0).
func (s *scripted) reserve(ctx context.Context, script *script, key string, cost Cost, maxWait time.Duration, extra ...any) (Reservation, error) {
	r, _, by, err := s.reserveBy(ctx, script, key, cost, maxWait, extra...)
	s.m.reserved(key, cost, r, err, by, false)
	return r, err
}

// shared implements moveUp: the fleet charges a key on Redis.
func (s *scripted) shared(string) bool { return true }

// waiters implements moveUp: this bucket's waiters gauge, or nil.
func (s *scripted) waiters(string) *waiters { return s.m.waiters() }

// reserveBy is reserve, saying what served it, and the reservation's
// place if the script gave one.
func (s *scripted) reserveBy(ctx context.Context, script *script, key string, cost Cost, maxWait time.Duration, extra ...any) (Reservation, []constraint, server, error) {
	var buf [4]any
	head := append(append(buf[:0], waitArg(maxWait)), extra...)
	argv, dims, err := s.prepare(key, cost, true, false, head...)
	if err != nil || argv == nil {
		return Reservation{OK: err == nil}, nil, servedRedis, err
	}
	v, err := s.runArgv(ctx, script, argv).Result()
	return s.decided(ctx, key, cost, maxWait, v, err, dims)
}

// decided is the outcome of a reservation of cost from key whose reply
// from a reserve script over dims dimension keys was v, or whose call
// failed with err: the fail-open share's if Redis is unavailable.
func (s *scripted) decided(ctx context.Context, key string, cost Cost, maxWait time.Duration, v any, err error, dims int) (Reservation, []constraint, server, error) {
	var rep reserveReply
	if err == nil {
		rep, err = reservation(v, dims, len(s.windowsCharged(cost, true)))
	}
	if err != nil {
		if sh := s.fo.fallback(err); sh != nil {
			r, err := sh.reserve(ctx, key, cost, maxWait, !sent(err))
			return r, nil, servedShare, err
		}
		return Reservation{}, nil, servedRedis, fmt.Errorf("bucket: redis reserve: %w", err)
	}
	w := rep.wait
	if w > max(maxWait, 0).Microseconds() {
		// A reply the scripts never give (a proxy's, a server's bug): the
		// caller's wait accounting must not trust it.
		return Reservation{}, nil, servedRedis, fmt.Errorf("bucket: redis reserve: unexpected reply %d: a wait beyond %v", w, maxWait)
	}
	s.heldLower(ctx, key, rep.pins&pinHeld != 0)
	if rep.pins&pinIgnored != 0 {
		s.pinLog.ignored(s.fo.logger(), s.prefix)
	}
	if len(rep.windows) > 0 {
		s.keepWindows(ctx, key, s.windowsCharged(cost, w >= 0), rep.windows)
	}
	if w > 0 {
		s.fo.slot(key, s.fo.clock.Now().Add(micros(w)))
	}
	s.fo.settle(ctx, s.debit, s.gauge, key)
	if w < 0 {
		return Reservation{RetryAfter: micros(-w), Epoch: rep.epoch}, nil, servedRedis, nil
	}
	return Reservation{OK: true, Delay: micros(w), Epoch: rep.epoch}, rep.place, servedRedis, nil
}

// stateKeys is how many of a script's KEYS are not a dimension's.
func (s *scripted) stateKeys() int {
	if s.state {
		return 1
	}
	return 0
}

// micros converts n >= 0 microseconds to a Duration, saturated at the
// longest (as is a negative n: the negation of the least int64).
func micros(n int64) time.Duration {
	if n < 0 || n > int64(Unlimited/time.Microsecond) {
		return Unlimited
	}
	return time.Duration(n) * time.Microsecond
}

// pinLog limits the error logs of pins ignored (see pinOne in the
// scripts) to one a minute.
type pinLog struct{ at atomic.Int64 }

// ignored logs at error level, at most once a minute, that a key of the
// bucket with prefix has a pin too far from this process's limit to count.
func (p *pinLog) ignored(log *slog.Logger, prefix string) {
	now, last := time.Now().UnixNano(), p.at.Load()
	if now-last < int64(time.Minute) || !p.at.CompareAndSwap(last, now) {
		return
	}
	log.LogAttrs(context.Background(), slog.LevelError,
		"sluice: a process of the fleet limits a key of this bucket more than 1000 times lower or higher than this "+
			"process does: a configuration error; neither holds the other to its limit",
		slog.String("prefix", prefix))
}

// warnHeld logs, at most once a minute, that Redis holds a key of this
// bucket below this process's limits (see NewRedis).
func (s *scripted) warnHeld() {
	now, last := time.Now().UnixNano(), s.fo.heldAt.Load()
	if now-last < int64(time.Minute) || !s.fo.heldAt.CompareAndSwap(last, now) {
		return
	}
	s.fo.logger().LogAttrs(context.Background(), slog.LevelWarn,
		"sluice: another process of the fleet limits a key of this bucket lower than this process does, "+
			"and the lower limit holds while a process uses it: give every process the same limits",
		slog.String("prefix", s.prefix))
}

// adjust runs an adjust script, whose ARGV are head, then the groups of
// prepare.
func (s *scripted) adjust(ctx context.Context, script *script, key string, delta Cost, head ...any) error {
	err := s.adjustWith(ctx, script, key, delta, false, head...)
	if err == nil {
		s.m.adjusted(key, delta)
		if s.waiting != nil {
			s.waiting.fire(key, delta)
		}
	}
	return err
}

// adjustWith is adjust, of a share's debt (see failover.settle) if debt: a
// debit whole, not cut to a burst, and owed again, not charged to the share
// again, if Redis fails before it runs.
func (s *scripted) adjustWith(ctx context.Context, script *script, key string, delta Cost, debt bool, head ...any) error {
	argv, _, err := s.prepare(key, delta, false, debt, head...)
	if err != nil || argv == nil {
		return err
	}
	v, err := s.runArgv(ctx, script, argv).Result()
	if err != nil {
		sh := s.fo.fallback(err)
		switch {
		case sh == nil:
			return fmt.Errorf("bucket: redis adjust: %w", err)
		case debt:
			if !sent(err) {
				sh.owe(key, delta)
			}
			return nil
		}
		return sh.adjust(ctx, key, delta, !sent(err))
	}
	if s.fo.windows != nil {
		// The token bucket's adjust script says what it left of the
		// windows (see adjustScript); a reply it never gives is ignored:
		// the adjustment was made.
		in := s.fo.windows.adjusted(delta, debt)
		if v, ok := v.([]any); ok && len(in) > 0 && len(v) == 1+2*len(in) {
			if ws, ok := windowsOf(v[1:]); ok {
				s.keepWindows(ctx, key, in, ws)
			}
		}
	}
	return nil
}

// tokens runs a tokens script over every dimension. Its ARGV are head, then
// the groups of prepare with amount 0, and it replies with each key's
// tokens or remaining allowance as a string, then, from a script of a
// bucket that adapts, each key's rate.
func (s *scripted) tokens(ctx context.Context, script *script, key string, head ...any) (tokens, rates Cost, err error) {
	if key == "" {
		return nil, nil, ErrInvalidKey
	}
	keys := make([]string, 0, len(s.dims)+1)
	base := s.baseKey(key)
	if s.state {
		keys = append(keys, base)
	}
	args := make([]any, 0, len(head)+dimArgs*len(s.dims))
	args = append(args, head...)
	for i, d := range s.dims {
		keys = append(keys, s.dimKey(base, d.name))
		args = s.group(args, i, smallAmounts[0])
	}
	res, err := s.run(ctx, script, keys, args...).StringSlice()
	if err != nil {
		return nil, nil, fmt.Errorf("bucket: redis tokens: %w", err)
	}
	n := len(s.dims)
	if len(res) != n && (!s.state || len(res) != 2*n) {
		return nil, nil, fmt.Errorf("bucket: redis tokens: unexpected reply %v", res)
	}
	read := func(vs []string) (Cost, error) {
		c := make(Cost, n)
		for i, d := range s.dims {
			v, err := strconv.ParseFloat(vs[i], 64)
			if err != nil {
				return nil, fmt.Errorf("bucket: redis tokens: %w", err)
			}
			c[d.name] = v
		}
		return c, nil
	}
	if tokens, err = read(res[:n]); err != nil || len(res) == n {
		return tokens, nil, err
	}
	rates, err = read(res[n:])
	return tokens, rates, err
}
