package bucket

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// ErrUnavailable is matched by every *UnavailableError.
var ErrUnavailable = errors.New("bucket: redis unavailable")

// UnavailableError reports that Redis could not serve a call: it failed
// (connection refused or reset, the per-call timeout, LOADING, READONLY,
// CLUSTERDOWN, MASTERDOWN, TRYAGAIN, BUSY, OOM, NOREPLICAS, too many
// clients, authentication), or the bucket's circuit breaker stopped the call
// because Redis failed recently. Nothing was taken.
//
// A bucket that fails closed (WithFailClosed) returns it from every method;
// one that fails open (the default) only from Tokens.
type UnavailableError struct {
	Err error // Redis's error, or gobreaker.ErrOpenState or ErrTooManyRequests
}

func (e *UnavailableError) Error() string { return "bucket: redis unavailable: " + e.Err.Error() }

// Is reports whether target is ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// Defaults of the failure policy.
const (
	// defaultRedisTimeout bounds one call to Redis. A healthy Redis answers
	// a script in well under a millisecond on a LAN, but a call also meets
	// Redis's own stalls (a fork, an fsync: tens of milliseconds), a new
	// connection and a script load after a restart (four round trips), and
	// this process's stalls: GC, and the CPU throttling of a container
	// (whole 100 ms periods). A healthy Redis taken for dead costs this
	// process's share on top of what Redis gives for a breaker period, so
	// the timeout stays above all those; and it is small next to the calls
	// being throttled (an LLM call takes seconds), and only one call per
	// breaker period pays it while Redis is down.
	defaultRedisTimeout = 250 * time.Millisecond
	// defaultBreakerTimeout is how long the breaker stays open before it
	// lets one call probe Redis again: while Redis is down, one call per
	// period pays at most one Redis timeout; once it is back, calls return
	// to it within a period, after go-redis dials again (its pool, after
	// PoolSize failed dials, dials only once a second).
	defaultBreakerTimeout = 500 * time.Millisecond
)

// Fleet membership: every process that uses a failing-open bucket adds
// itself, at most once per beatInterval, to the sorted set
// <prefix>:members scored by Redis TIME; members silent for memberTTL are
// dropped, and the set expires memberTTL after the last beat.
const (
	beatInterval = time.Second
	memberTTL    = 10 * time.Second
)

// redisPolicy is what the options say about Redis failures.
type redisPolicy struct {
	failClosed bool
	timeout    time.Duration // ≤ 0: defaultRedisTimeout
	breaker    gobreaker.Settings
	memberID   string // "": processID
}

// WithFailOpen makes a Redis-backed bucket (Redis, FixedWindow,
// SlidingLog) keep admitting while Redis is unavailable, from a Local token
// bucket at this process's share of every limit: Rate/n and Burst/n, where
// n is the number of live processes of the fleet (those that used a bucket
// with the same prefix within the last 10 s), counted in Redis while it
// worked and kept while it does not (a process that never reached Redis
// counts itself alone). Adjust and Observe go to the share bucket too.
// Calls go back to Redis once a probe finds it answering again (see
// WithRedisBreaker). This is the default.
//
// While Redis is down, the fleet admits at most Burst + Rate·T over a time
// T, like a healthy bucket, if its size did not change. Across an outage it
// may exceed that bound by the share buckets' Burst (they start full, while
// the Redis bucket may have been empty); by the Redis bucket's Burst, if
// Redis came back without its data; and, as processes go back to Redis one
// by one within a breaker period, by their shares taken on top of Redis
// for that long. A cost larger than the share's burst is admitted once the
// share bucket is full, and its excess owed. A window bucket (FixedWindow,
// SlidingLog) falls back to a token bucket of the same shape.
func WithFailOpen() Option {
	return optionFunc(func(c *config) { c.redis.failClosed = false })
}

// WithFailClosed makes a Redis-backed bucket fail every call with an
// *UnavailableError (errors.Is ErrUnavailable) while Redis is unavailable,
// taking nothing: the caller decides what to do.
func WithFailClosed() Option {
	return optionFunc(func(c *config) { c.redis.failClosed = true })
}

// WithRedisTimeout bounds each call a Redis-backed bucket makes to Redis to
// d, go-redis's retries included; d ≤ 0 means 250 ms. A call that runs out
// of time is a Redis failure; one whose own context ends first is not.
//
// The bound is a context deadline. go-redis honours it when dialing and
// waiting for a pooled connection, but on a connection's reads and writes
// only with ContextTimeoutEnabled set in its options; without it a server
// that accepts connections but does not answer holds a call for the
// client's ReadTimeout (3 s by default). Set ContextTimeoutEnabled, or
// ReadTimeout and WriteTimeout no longer than d.
func WithRedisTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.redis.timeout = d })
}

// WithRedisBreaker sets the circuit breaker that a Redis-backed bucket puts
// around Redis. Zero fields mean sluice's defaults, not gobreaker's: Name is
// the key prefix, Timeout (how long the breaker stays open before one call
// probes Redis) is 500 ms, and ReadyToTrip opens it at the first failure
// (go-redis has already retried within the call). The breaker is told of
// Redis failures and of calls Redis answered; a call whose own context
// ended first counts as neither. OnStateChange is the place to log or count
// outages.
func WithRedisBreaker(s gobreaker.Settings) Option {
	return optionFunc(func(c *config) { c.redis.breaker = s })
}

// processID names this process in the fleet's membership sets.
var processID = func() string {
	var b [12]byte
	rand.Read(b[:]) // never returns an error
	return base64.RawURLEncoding.EncodeToString(b[:])
}()

// beatScript adds ARGV[1] to the members set KEYS[1] at the current Redis
// TIME, drops the members not seen for ARGV[2] µs, pushes the set's expiry
// to ARGV[3] ms from now, and replies with the number of members.
var beatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return redis.call('ZCARD', KEYS[1])
`)

// failover applies a Redis-backed bucket's failure policy: a timeout on
// every call, a circuit breaker, and, failing open, the membership count
// and this process's share bucket.
type failover struct {
	rdb     redis.UniversalClient
	open    bool // fail open
	timeout time.Duration
	cb      *gobreaker.TwoStepCircuitBreaker[struct{}]
	dims    []dim
	clock   Clock
	local   []Option // the share bucket's, besides its limits

	beatKeys []string
	beatArgs []any

	members  atomic.Int64 // the last count; 0 before the first
	nextBeat atomic.Int64 // Unix ns
	share    atomic.Pointer[share]
}

func newFailover(rdb redis.UniversalClient, c config, dims []dim) *failover {
	p := c.redis
	f := &failover{rdb: rdb, open: !p.failClosed, timeout: p.timeout, dims: dims, clock: c.clock,
		local: []Option{WithClock(c.clock), WithPolicy(c.policy)}}
	if f.timeout <= 0 {
		f.timeout = defaultRedisTimeout
	}
	s := p.breaker
	if s.Name == "" {
		s.Name = c.prefix
	}
	if s.Timeout <= 0 {
		s.Timeout = defaultBreakerTimeout
	}
	if s.ReadyToTrip == nil {
		s.ReadyToTrip = func(gobreaker.Counts) bool { return true }
	}
	excluded := s.IsExcluded
	s.IsExcluded = func(err error) bool {
		return err == errNotRedis || excluded != nil && excluded(err)
	}
	f.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](s)
	if f.open {
		id := p.memberID
		if id == "" {
			id = processID
		}
		f.beatKeys = []string{c.prefix + ":members"}
		f.beatArgs = []any{id, strconv.FormatInt(memberTTL.Microseconds(), 10),
			strconv.FormatInt(memberTTL.Milliseconds(), 10)}
	}
	return f
}

// errNotRedis is what the breaker is told of a call that ended for a
// reason that says nothing about Redis: the caller's context.
var errNotRedis = errors.New("bucket: not a Redis failure")

// do makes call, one call to Redis, through the breaker and within the
// timeout. It returns nil; an error that errors.Is ctx.Err() if the
// caller's context ended first; call's error if it is an error reply from a
// working Redis; or a *UnavailableError.
func (f *failover) do(ctx context.Context, call func(context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	done, err := f.cb.Allow()
	if err != nil {
		return &UnavailableError{Err: err}
	}
	cctx, cancel := context.WithTimeout(ctx, f.timeout)
	err = call(cctx)
	cancel()
	switch {
	case err == nil:
		done(nil)
		return nil
	case callerDone(ctx) != nil:
		done(errNotRedis)
		cerr := callerDone(ctx)
		if errors.Is(err, cerr) {
			return err
		}
		return fmt.Errorf("%w (%w)", cerr, err) // e.g. an i/o timeout set from ctx
	case !redisFailure(err):
		done(nil) // Redis answered
		return err
	}
	done(err)
	return &UnavailableError{Err: err}
}

// callerDone returns ctx's error, or context.DeadlineExceeded once its
// deadline has passed: a socket read that timed out at that deadline may
// return before ctx's own timer has marked it done.
func callerDone(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// redisFailure reports whether err, from a call whose context is still
// live, means that Redis cannot serve: anything but an error reply, and the
// error replies of a server that is loading, read-only, failing over, out
// of memory, busy, full or refusing our credentials. Other replies (a
// script error, CROSSSLOT) come from a working Redis and are bugs to show.
func redisFailure(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return true
	}
	return redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsClusterDownError(err) ||
		redis.IsMasterDownError(err) || redis.IsTryAgainError(err) || redis.IsOOMError(err) ||
		redis.IsNoReplicasError(err) || redis.IsMaxClientsError(err) || redis.IsAuthError(err) ||
		redis.HasErrorPrefix(err, "BUSY ")
}

// beat counts the fleet, if this bucket fails open and the last count is
// beatInterval old. At most one call at a time does it.
func (f *failover) beat(ctx context.Context) {
	if !f.open {
		return
	}
	now := f.clock.Now().UnixNano()
	next := f.nextBeat.Load()
	if now < next || !f.nextBeat.CompareAndSwap(next, now+int64(beatInterval)) {
		return
	}
	var n int64
	err := f.do(ctx, func(ctx context.Context) error {
		var err error
		n, err = beatScript.Run(ctx, f.rdb, f.beatKeys, f.beatArgs...).Int64()
		return err
	})
	if err == nil && n > 0 {
		f.members.Store(n)
	}
}

// fallback returns the share bucket that takes a call which failed with
// err, if the bucket fails open and err is a *UnavailableError; else nil.
func (f *failover) fallback(err error) *share {
	if !f.open {
		return nil
	}
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		return nil
	}
	n := max(f.members.Load(), 1)
	old := f.share.Load()
	if old != nil && old.members == n {
		return old
	}
	sh := newShare(f.dims, n, f.local)
	if !f.share.CompareAndSwap(old, sh) {
		return f.share.Load()
	}
	return sh
}

// share is this process's share of a bucket's limits, when the fleet has
// members processes.
type share struct {
	members int64
	local   *Local
}

// newShare returns the share of a bucket with dims for one of n members,
// a Local bucket made with opts.
func newShare(dims []dim, n int64, opts []Option) *share {
	part := func(l Limit) Limit { return Limit{Rate: l.Rate / float64(n), Burst: l.Burst / float64(n)} }
	opts = slices.Clip(opts)
	for _, d := range dims { // Requests too, replacing NewLocal's first argument
		opts = append(opts, WithLimit(d.name, part(d.limit)))
	}
	return &share{members: n, local: NewLocal(part(dims[0].limit), opts...)}
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
		return s.local.Reserve(ctx, key, cost, maxWait)
	}
	r, err := s.local.Reserve(ctx, key, clipped, maxWait)
	if err != nil || !r.OK {
		return r, err
	}
	return r, s.local.Adjust(ctx, key, excess)
}

// run runs script on Redis through the failure policy (see failover.do);
// when that fails, the Cmd's error is do's. After a call that worked, it
// counts the fleet if that is due.
func (s *scripted) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	var cmd *redis.Cmd
	err := s.fo.do(ctx, func(ctx context.Context) error {
		cmd = script.Run(ctx, s.rdb, keys, args...)
		return cmd.Err()
	})
	if cmd == nil {
		cmd = redis.NewCmd(ctx)
	}
	if err != nil {
		cmd.SetErr(err)
		return cmd
	}
	s.fo.beat(ctx)
	return cmd
}
