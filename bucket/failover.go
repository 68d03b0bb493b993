package bucket

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/wait"
)

// ErrUnavailable is matched by every *UnavailableError.
var ErrUnavailable = errors.New("bucket: redis unavailable")

// UnavailableError reports that Redis could not serve a call: it failed
// (connection refused or reset, a lost reply, the per-call timeout, LOADING,
// CLUSTERDOWN, MASTERDOWN, TRYAGAIN, BUSY, OOM, NOREPLICAS, too many
// clients, a replica's READONLY during a failover), or the bucket's circuit
// breaker stopped the call because Redis failed recently. Nothing was
// taken, or (a lost reply) what was taken is lost: a call that may have
// run is never sent again (one that certainly did not run, turned away by
// a cluster settling or a server loading, is, up to three times).
//
// A bucket that fails closed (WithFailClosed) returns it from every method;
// one that fails open (the default) only from Tokens.
type UnavailableError struct {
	Addr string // the client's address(es)
	Err  error  // Redis's error, or gobreaker.ErrOpenState or ErrTooManyRequests

	isolated bool // the call failed alone (failover.isolated): no sign of the fleet's outage
}

func (e *UnavailableError) Error() string {
	return "bucket: redis at " + e.Addr + " unavailable: " + e.Err.Error()
}

// Is reports whether target is ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// ErrMisconfigured is matched by every *ConfigError.
var ErrMisconfigured = errors.New("bucket: redis misconfigured")

// ConfigError reports a Redis that answers but cannot serve the bucket, for
// a reason no wait cures: credentials refused (NOAUTH, WRONGPASS), a command
// the ACL user may not run (NOPERM), a replica's address (READONLY at first
// contact, or for 30 s on end), a command the server does not know, or a
// maxmemory-policy that may evict the bucket's keys. Every method returns it,
// whatever the failure policy: failing open would hide it for ever and
// admit each process's share as if it were alone. Nothing was taken. It is
// logged at error level too, at most every 10 s.
type ConfigError struct {
	Addr string // the client's address(es)
	Err  error  // Redis's error, or what the first contact found
}

func (e *ConfigError) Error() string {
	return "bucket: redis at " + e.Addr + " cannot serve the bucket: " + e.Err.Error() + configHint(e.Err)
}

// Is reports whether target is ErrMisconfigured.
func (e *ConfigError) Is(target error) bool { return target == ErrMisconfigured }

// Unwrap returns the cause.
func (e *ConfigError) Unwrap() error { return e.Err }

// configHint says what to do about a configuration error.
func configHint(err error) string {
	switch {
	case redis.IsAuthError(err):
		return " (check the password and user in the client's options)"
	case redis.IsPermissionError(err):
		return " (grant the ACL user EVALSHA, EVAL, SCRIPT LOAD and INFO, and for an InFlight SUBSCRIBE and the channels <prefix>:inflight:*)"
	case redis.IsReadOnlyError(err):
		return " (the address is a replica's: give the client the master's, or use a Sentinel or Cluster client)"
	case errors.Is(err, errEviction):
		return " (set maxmemory-policy noeviction on this server, or give sluice a Redis of its own; see WithEvictionAllowed)"
	}
	return ""
}

// errEviction is wrapped by the error of a server whose maxmemory-policy
// may evict keys.
var errEviction = errors.New("maxmemory-policy may evict the bucket's keys")

// Defaults of the failure policy.
const (
	// defaultRedisTimeout bounds one call to Redis. A healthy Redis answers
	// a script in well under a millisecond on a LAN, but a call also meets
	// Redis's own stalls (a fork, an fsync: tens of milliseconds), a new
	// connection (two or three round trips), and this process's stalls:
	// GC, and the CPU throttling of a container (whole 100 ms periods). A
	// healthy Redis taken for dead costs this process's share on top of
	// what Redis gives for a breaker period, so the timeout stays above all
	// those; and it is small next to the calls being throttled (an LLM call
	// takes seconds), and only one call per breaker period pays it while
	// Redis is down. It stretches to slowFactor times the latency Redis has
	// shown, at most maxRedisTimeout: a slow Redis is slow, not down.
	defaultRedisTimeout = 250 * time.Millisecond
	slowFactor          = 8
	maxRedisTimeout     = 5 * time.Second
	// contactTimeout bounds the first contact with Redis: a new connection
	// (go-redis's handshake), INFO, then the scripts loaded, about nine
	// round trips in all: at 500 ms each.
	contactTimeout = 5 * time.Second
	// defaultBreakerTimeout is how long the breaker stays open before it
	// lets one call probe Redis again: while Redis is down, one call per
	// period pays at most one Redis timeout; once it is back, calls return
	// to it within a period, after go-redis dials again (its pool, after
	// PoolSize failed dials, dials only once a second).
	defaultBreakerTimeout = 500 * time.Millisecond
	// readOnlyGrace is how long a READONLY reply from a server that served
	// before is taken for a failover under way, not a misconfiguration.
	readOnlyGrace = 30 * time.Second
	// recheckEvery is how often a configuration error is checked again, so
	// that a fixed server is used without a restart.
	recheckEvery = 10 * time.Second
	// defaultPolicyEvery is how often a server's maxmemory-policy is read
	// again after the first contact: an operator may change it.
	defaultPolicyEvery = time.Minute
)

// Fleet membership: every process that uses a failing-open bucket adds
// itself, at most once per beatInterval, to the sorted set
// <prefix>:members scored by Redis TIME; members silent for memberTTL are
// dropped, and the set expires memberTTL after the last beat.
const (
	beatInterval = time.Second
	memberTTL    = 10 * time.Second
	// maxMembers is the largest count believed: a bogus reply must not
	// shrink every share to nothing.
	maxMembers = 100_000
)

// redisPolicy is what the options say about Redis failures.
type redisPolicy struct {
	failClosed  bool
	timeout     time.Duration // ≤ 0: defaultRedisTimeout
	breaker     gobreaker.Settings
	memberID    string // "": processID
	evictable   bool   // WithEvictionAllowed
	logger      *slog.Logger
	policyEvery time.Duration // ≤ 0: defaultPolicyEvery
}

// WithFailOpen makes a Redis-backed bucket (Redis, FixedWindow,
// SlidingLog) keep admitting while Redis is unavailable, from a Local token
// bucket at this process's share of every limit: Rate/n and Burst/n, where
// n is the number of live processes of the fleet (those that used a bucket
// with the same prefix within the last 10 s), counted in Redis while it
// worked and kept while it does not (a process that never reached Redis
// counts itself alone). Adjust and Observe go to the share bucket too.
// Calls go back to Redis once a probe finds it answering again (see
// WithRedisBreaker). This is the default. A misconfigured Redis (see
// ConfigError) is not unavailable: its error is returned.
//
// Across an outage the fleet admits at most Burst + Rate·T + Burst/n over
// any time T, if its size did not change: each outage starts a share bucket
// empty, each key after the slots this process holds for it on Redis and on
// the last outage's share (what the fleet had left is not known to one
// process, and empty never over-admits); what a process admitted on its
// share is debited from the Redis bucket by the first call on its key that
// works again: every slot still to come, and at most a burst of those past
// (Redis refilled while the fleet spent its shares, and both must not be
// spent); and for a window of the limit after an outage, a key
// that Redis no longer has (it restarted empty) starts cold, as
// adaptive.Policy.ColdStart says, not full; and a 429 of a request a share
// admitted (its Reservation.Epoch says so) pauses the key but counts toward
// no decrease of Redis's: it is the outage's overshoot, not a sign that the
// limit is wrong. A cost larger than the share's
// burst is admitted once the share bucket holds its burst, and its excess
// owed. A window bucket (FixedWindow, SlidingLog) falls back to a token
// bucket of the same shape, and after a restart starts its windows afresh.
// An InFlight falls back to n over the members in flight (see InFlight).
func WithFailOpen() Option {
	return option{"WithFailOpen", forShared, func(c *config) { c.redis.failClosed = false }}
}

// WithFailClosed makes a Redis-backed bucket fail every call with an
// *UnavailableError (errors.Is ErrUnavailable) while Redis is unavailable,
// taking nothing: the caller decides what to do. An InFlight's waiters
// queued on Redis fail so too, once a renewal finds it unavailable.
func WithFailClosed() Option {
	return option{"WithFailClosed", forShared, func(c *config) { c.redis.failClosed = true }}
}

// WithRedisTimeout bounds each call a Redis-backed bucket makes to Redis to
// d, go-redis's retries included; d ≤ 0 means 250 ms. The bound stretches
// to 8 times the latency Redis has shown of late, up to 5 s, so that a slow
// Redis (a far region, a loaded server) is slow but correct rather than
// taken for dead; the first contact, which opens a connection and loads the
// scripts, has 5 s (or 4d). A call that runs out of time is a Redis failure; one
// whose own context ends first is not.
//
// The bound is a context deadline: the caller's, if it comes first; for a
// caller's context that is never cancelled (context.Background), one that
// the calls begun within a millisecond of each other share, which may come
// up to that millisecond sooner. go-redis honours it when dialing and
// waiting for a pooled connection, but on a connection's reads and writes
// only with ContextTimeoutEnabled set in its options; without it a server
// that accepts connections but does not answer holds a call for the
// client's ReadTimeout (3 s by default). Set ContextTimeoutEnabled, or
// ReadTimeout and WriteTimeout no longer than d.
func WithRedisTimeout(d time.Duration) Option {
	return option{"WithRedisTimeout", forShared, func(c *config) { c.redis.timeout = d }}
}

// WithEvictionAllowed lets a Redis-backed bucket use a server whose
// maxmemory-policy is not noeviction. By default the first contact checks
// the policy (INFO memory), and so does a call every minute after it, and
// every call fails with a *ConfigError if it is anything else: a server that evicts keys under memory pressure resets
// buckets to full, and the fleet is admitted many times its limit (sluice's
// keys have short TTLs, so the volatile-* policies evict them first). Allow
// it only for a server that will never reach its maxmemory.
func WithEvictionAllowed() Option {
	return option{"WithEvictionAllowed", forShared, func(c *config) { c.redis.evictable = true }}
}

// WithLogger sets where a bucket logs; slog.Default() by default. A Local
// or Redis bucket warns, at most once a minute per key, when a key is held
// below half a configured limit by what the provider reported or by the
// refusals its rate was lowered for (the key, as WithMetricKeyLabel labels
// it if given, the configured and the effective limits, and the header
// that set it, or "refusals"). A Redis-backed bucket logs its
// configuration errors (at error level, at most every 10 s), the start of
// an outage (at warn level: calls take the share, or fail; at error level
// if Redis has never answered since the process started: a likely
// misconfiguration) and its end (info), and what its first contact could
// not check (warn). go-redis logs its own dial failures through its
// process-wide logger (redis.SetLogger), which sluice leaves alone.
func WithLogger(l *slog.Logger) Option {
	return option{"WithLogger", forShared | forLocal, func(c *config) { c.redis.logger = l }}
}

// WithRedisBreaker sets the circuit breaker that a Redis-backed bucket puts
// around Redis. Zero fields mean sluice's defaults, not gobreaker's: Name is
// the key prefix, Timeout (how long the breaker stays open before one call
// probes Redis) is 500 ms, and ReadyToTrip opens it at the first failure.
// The breaker is told of Redis failures and of calls Redis answered. A call
// whose own context ended first counts as neither; nor does one that failed
// alone (see failover.isolated: Redis answered a call begun later, or its
// connection broke within a second of a call that worked), which goes to
// the share bucket by itself. An outage's start and end are logged (see
// WithLogger); OnStateChange, called after that, is the place to count them.
func WithRedisBreaker(s gobreaker.Settings) Option {
	return option{"WithRedisBreaker", forShared, func(c *config) { c.redis.breaker = s }}
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
var beatScript = newScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return redis.call('ZCARD', KEYS[1])
`)

// failover applies a Redis-backed bucket's failure policy: the first
// contact, a timeout on every call, a circuit breaker, the errors no wait
// cures, and, failing open, the membership count and this process's share
// bucket.
type failover struct {
	rdb       redis.UniversalClient
	addr      string
	open      bool // fail open
	timeout   time.Duration
	evictable bool
	log       *slog.Logger
	cb        *gobreaker.TwoStepCircuitBreaker[struct{}]
	dims      []dim
	clock     Clock
	policy    adaptive.Policy // the share bucket's
	window    time.Duration   // the limit's: how long a key starts cold after an outage

	beatKeys []string
	beatArgs []any

	contact contact

	latency   atomic.Int64              // of the calls that worked, smoothed, in ns
	deadlines deadlines                 // of the calls (call)
	answered  atomic.Int64              // when the last call that worked began, since monoBase, in ns
	misconfig atomic.Pointer[misconfig] // the last configuration error, if none has worked since
	served    atomic.Bool               // a script has run
	readOnly  atomic.Int64              // when READONLY replies began, Unix ns; 0 if not
	loggedAt  atomic.Int64              // the last configuration error logged, Unix ns
	heldAt    atomic.Int64              // the last warning that a key is held lower, Unix ns (scripted.warnHeld)
	failing   atomic.Bool               // calls have gone to the share since the last that worked
	coldUntil atomic.Int64              // Unix ns

	pins       pins         // the fleet's lower limits this process has seen, by key
	windows    *windowsSeen // the token bucket's windows as this process has seen them; nil: none
	slotsMu    sync.Mutex
	slots      map[string]slotSeen // each key's last slot on Redis, by clock
	slotsSweep int                 // len(slots) at which passed slots are next forgotten
	shareMu    sync.Mutex          // held to replace share

	m *meters // nil: no metrics

	members     atomic.Int64 // the last count; 0 before the first
	nextBeat    atomic.Int64 // Unix ns
	policyEvery time.Duration
	nextPolicy  atomic.Int64 // Unix ns; 0 before the first call
	share       atomic.Pointer[share]
}

func newFailover(rdb redis.UniversalClient, c config, dims []dim) *failover {
	p := c.redis
	f := &failover{rdb: rdb, addr: clientAddr(rdb), open: !p.failClosed, timeout: p.timeout,
		evictable: p.evictable, log: p.logger, dims: dims, clock: c.clock, contact: newContact(),
		policy: c.policy}
	for _, d := range dims {
		if !d.window() { // which start full, not cold
			f.window = max(f.window, wait.Seconds(d.limit.Burst/d.limit.Rate))
		}
	}
	if f.timeout <= 0 {
		f.timeout = defaultRedisTimeout
	}
	if f.policyEvery = p.policyEvery; f.policyEvery <= 0 {
		f.policyEvery = defaultPolicyEvery
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
	changed := s.OnStateChange
	s.OnStateChange = func(name string, from, to gobreaker.State) {
		f.stateChanged(from, to)
		if changed != nil {
			changed(name, from, to)
		}
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

// stateChanged logs an outage's start at warn level (and what calls do
// meanwhile: take this process's share, or fail), or at error level if
// Redis has never answered this process, which is far more likely a wrong
// address than an outage; and its end at info. A probe's failure, from
// half-open, is no news.
func (f *failover) stateChanged(from, to gobreaker.State) {
	switch {
	case to == gobreaker.StateOpen && from == gobreaker.StateClosed:
		what, state := "calls fail with ErrUnavailable (fail-closed)", "fail_closed"
		if f.open {
			what, state = "calls take this process's share of the limit (fail-open)", "fail_open"
		}
		f.m.transition(state)
		if sh := f.share.Load(); sh != nil {
			sh.outage.Store(true) // the share that the failure which opened it went to
		}
		if f.answered.Load() == 0 {
			f.logger().LogAttrs(context.Background(), slog.LevelError, "sluice: redis has not answered since this "+
				"process started, likely a misconfiguration: check the address, that a server listens there "+
				"and that this host can reach it; meanwhile "+what, slog.String("addr", f.addr))
			return
		}
		f.logger().LogAttrs(context.Background(), slog.LevelWarn, "sluice: redis unavailable: "+what,
			slog.String("addr", f.addr))
	case to == gobreaker.StateClosed && f.misconfig.Load() == nil: // a configuration error is logged as one
		f.m.transition("serving")
		f.logger().LogAttrs(context.Background(), slog.LevelInfo, "sluice: redis serves the bucket again",
			slog.String("addr", f.addr))
	}
}

// healthy reports whether Redis serves: the breaker is closed, and no
// call has gone to the share since the last that worked.
func (f *failover) healthy() bool {
	return !f.failing.Load() && f.cb.State() == gobreaker.StateClosed
}

// metricState is Redis's state for the metrics: 0 serving, 1 unavailable
// and failing open, 2 unavailable and failing closed, 3 misconfigured.
func (f *failover) metricState() int {
	switch {
	case f.lastConfigError() != nil:
		return 3
	case f.cb.State() == gobreaker.StateClosed && !f.failing.Load():
		return 0
	case f.open:
		return 1
	}
	return 2
}

// clientAddr names the server(s) rdb talks to, for errors.
func clientAddr(rdb redis.UniversalClient) string {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().Addr
	case *redis.ClusterClient:
		return strings.Join(c.Options().Addrs, ",")
	case *redis.Ring:
		return strings.Join(slices.Sorted(maps.Keys(c.Options().Addrs)), ",")
	}
	return fmt.Sprintf("%T", rdb)
}

// errNotRedis is what the breaker is told of a call that ended for a
// reason that says nothing about Redis: the caller's context.
var errNotRedis = errors.New("bucket: not a Redis failure")

// do makes call, one call to Redis, after the first contact, through the
// breaker and within the timeout. It returns nil; an error that errors.Is
// ctx.Err() if the caller's context ended first; a *ConfigError; call's
// error if it is another error reply from a working Redis; or a
// *UnavailableError.
func (f *failover) do(ctx context.Context, call func(context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := f.contact.ready(ctx, f); err != nil {
		return err
	}
	return f.call(ctx, f.callTimeout(), call)
}

// call is do without the first contact, within timeout.
func (f *failover) call(ctx context.Context, timeout time.Duration, call func(context.Context) error) error {
	done, err := f.cb.Allow()
	if err != nil {
		if ce := f.lastConfigError(); ce != nil {
			return ce // the breaker opened over a Redis that cannot serve the bucket anyway
		}
		return &UnavailableError{Addr: f.addr, Err: err}
	}
	start := time.Now()
	cctx, cancel := f.deadlines.within(ctx, start, timeout)
	err = call(cctx)
	cancel()
	switch {
	case err == nil:
		if f.misconfig.Load() != nil {
			f.misconfig.Store(nil) // before the breaker may close: "serves again" is logged
		}
		done(nil)
		f.worked(start)
		return nil
	case callerDone(ctx) != nil:
		done(errNotRedis)
		cerr := callerDone(ctx)
		if errors.Is(err, cerr) {
			return err
		}
		return fmt.Errorf("%w (%w)", cerr, err) // e.g. an i/o timeout set from ctx
	}
	ce, ok := err.(*ConfigError) // found by the first contact
	if !ok {
		ce = f.misconfigured(err)
	}
	if ce != nil {
		f.misconfig.Store(&misconfig{ce: ce, at: time.Now()}) // before the breaker may close
		done(nil)                                             // Redis answered
		return f.logged(ce)
	}
	if !redisFailure(err) {
		done(nil) // Redis answered
		return err
	}
	if !redis.IsReadOnlyError(err) && f.readOnly.Load() != 0 {
		f.readOnly.Store(0) // READONLY replies must come on end to be a misconfiguration
	}
	if ce := f.lastConfigError(); ce != nil {
		// A Redis that could not serve the bucket a moment ago, failing
		// now, is still no outage to fail open through; but it is a
		// failure, and opens the breaker as one.
		done(err)
		return ce
	}
	isolated := f.isolated(start, err)
	if isolated {
		done(errNotRedis)
	} else {
		done(err)
	}
	return &UnavailableError{Addr: f.addr, Err: err, isolated: isolated}
}

// misconfig is a configuration error a call found, and when.
type misconfig struct {
	ce *ConfigError
	at time.Time
}

// lastConfigError returns the configuration error a call found within the
// last recheckEvery, if no call has worked since: the failures that follow
// it are that error still, not an outage. After that, a failure is what it
// looks like.
func (f *failover) lastConfigError() *ConfigError {
	if m := f.misconfig.Load(); m != nil && time.Since(m.at) < recheckEvery {
		return m.ce
	}
	return nil
}

// isolated reports whether a call begun at start that failed with err, a
// Redis failure, failed alone: Redis served a call begun after it, or its
// connection broke (a lost reply, a reset) within a second of a call that
// worked. Such a call goes to the share bucket, but opens no breaker for
// every other call: its fault was its connection's, not Redis's, and the
// next call dials afresh (a Redis that is down turns that away, and the
// breaker opens then; one whose connections all break opens it a second
// after its last call that worked).
func (f *failover) isolated(start time.Time, err error) bool {
	last := f.answered.Load()
	if last == 0 { // no call has worked yet
		return false
	}
	if last > int64(start.Sub(monoBase)) {
		return true
	}
	return brokenConn(err) && int64(time.Since(monoBase))-last < int64(isolatedFor)
}

// isolatedFor is how long after a call that worked a broken connection is
// taken for that connection's fault alone.
const isolatedFor = time.Second

// brokenConn reports whether err is a connection's that broke under a call:
// closed or reset by the other side.
func brokenConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// monoBase is the origin of failover.answered: times since it are read from
// the monotonic clock.
var monoBase = time.Now()

// callTimeout is the bound of one call: the configured timeout, stretched
// to slowFactor times the latency Redis has shown.
func (f *failover) callTimeout() time.Duration {
	return min(max(f.timeout, slowFactor*time.Duration(f.latency.Load())), maxRedisTimeout)
}

// worked records a call begun at start that Redis served: when it began,
// the latency, smoothed (up at once, down by a sixteenth of the difference
// per call), and the end of an outage, after which a key that Redis no
// longer has starts cold for a window of the limit.
func (f *failover) worked(start time.Time) {
	d := time.Since(start)
	for at := int64(start.Sub(monoBase)); ; {
		old := f.answered.Load()
		if old >= at || f.answered.CompareAndSwap(old, at) {
			break
		}
	}
	if old := f.latency.Load(); int64(d) > old {
		f.latency.Store(int64(d))
	} else {
		f.latency.Store(old - (old-int64(d))/16)
	}
	if f.readOnly.Load() != 0 {
		f.readOnly.Store(0)
	}
	if f.failing.Load() && f.failing.Swap(false) {
		f.coldUntil.Store(time.Now().Add(f.window).UnixNano())
	}
}

// cold reports whether a key that Redis does not have should start cold:
// during an outage (the call that ends it finds what Redis lost), and for a
// window of the limit after it.
func (f *failover) cold() bool {
	if f.failing.Load() {
		return true
	}
	u := f.coldUntil.Load()
	return u != 0 && time.Now().UnixNano() < u
}

// misconfigured returns the *ConfigError that err, a failed call's, is; or
// nil if it is not one.
func (f *failover) misconfigured(err error) *ConfigError {
	switch {
	case redis.IsAuthError(err), redis.IsPermissionError(err), redis.HasErrorPrefix(err, "unknown command"):
	case redis.IsReadOnlyError(err):
		if f.served.Load() { // a failover under way, for a while
			now := time.Now().UnixNano()
			f.readOnly.CompareAndSwap(0, now)
			if now-f.readOnly.Load() < int64(readOnlyGrace) {
				return nil
			}
		}
	default:
		return nil
	}
	return &ConfigError{Addr: f.addr, Err: err}
}

// logged logs ce at error level, if no configuration error was logged in the
// last recheckEvery, and returns it.
func (f *failover) logged(ce *ConfigError) *ConfigError {
	now := time.Now().UnixNano()
	last := f.loggedAt.Load()
	if now-last >= int64(recheckEvery) && f.loggedAt.CompareAndSwap(last, now) {
		f.logger().LogAttrs(context.Background(), slog.LevelError, "sluice: redis cannot serve the bucket",
			slog.String("addr", ce.Addr), slog.String("err", ce.Error()))
	}
	return ce
}

func (f *failover) logger() *slog.Logger {
	if f.log != nil {
		return f.log
	}
	return slog.Default()
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
// live and that is not a configuration error, means that Redis cannot
// serve: anything but an error reply, and the error replies of a server
// that is loading, read-only (failing over), out of memory, busy or full.
// Other replies (a script error, CROSSSLOT) come from a working Redis and
// are bugs to show.
func redisFailure(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return true
	}
	return redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsClusterDownError(err) ||
		redis.IsMasterDownError(err) || redis.IsTryAgainError(err) || redis.IsOOMError(err) ||
		redis.IsNoReplicasError(err) || redis.IsMaxClientsError(err) || redis.HasErrorPrefix(err, "BUSY ")
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
	err := f.call(ctx, f.callTimeout(), func(ctx context.Context) error {
		var err error
		n, err = beatScript.run(ctx, f.rdb, f.beatKeys, f.beatArgs...).Int64()
		return err
	})
	if err == nil && n > 0 && n <= maxMembers {
		f.members.Store(n)
	}
}

// run runs script on Redis through the failure policy (see failover.run).
func (s *scripted) run(ctx context.Context, script *script, keys []string, args ...any) *redis.Cmd {
	return s.fo.run(ctx, script, keys, args...)
}

// runArgv is run with its argv built (see scriptArgv, scripted.prepare).
func (s *scripted) runArgv(ctx context.Context, script *script, argv []any) *redis.Cmd {
	return s.fo.runArgv(ctx, script, argv)
}

// run runs script on Redis through the failure policy (see failover.do);
// when that fails, the Cmd's error is do's. After a call that worked, it
// counts the fleet if that is due.
func (f *failover) run(ctx context.Context, script *script, keys []string, args ...any) *redis.Cmd {
	return f.runArgv(ctx, script, scriptArgv(keys, args))
}

// runArgv is run with its argv built (see scriptArgv).
func (f *failover) runArgv(ctx context.Context, script *script, argv []any) *redis.Cmd {
	var cmd *redis.Cmd
	err := f.do(ctx, func(ctx context.Context) error {
		cmd = script.runArgv(ctx, f.rdb, argv)
		return cmd.Err()
	})
	if cmd == nil {
		cmd = redis.NewCmd(ctx)
	}
	if err != nil {
		cmd.SetErr(err)
		return cmd
	}
	if !f.served.Load() {
		f.served.Store(true) // a READONLY from now on may be a failover
	}
	f.beat(ctx)
	f.recheck(ctx)
	return cmd
}

// recheck reads the servers' maxmemory-policy again, if that is due: an
// evicting one found is a configuration error from then on, as at first
// contact. At most one call at a time does it.
func (f *failover) recheck(ctx context.Context) {
	if f.evictable {
		return
	}
	now := time.Now().UnixNano()
	next := f.nextPolicy.Load()
	if next == 0 {
		f.nextPolicy.CompareAndSwap(0, now+int64(f.policyEvery))
		return
	}
	if now < next || !f.nextPolicy.CompareAndSwap(next, now+int64(f.policyEvery)) {
		return
	}
	var found *ConfigError
	_ = f.call(ctx, f.callTimeout(), func(ctx context.Context) error {
		return f.forEachServer(ctx, func(ctx context.Context, rdb redis.UniversalClient) error {
			info := rdb.Info(ctx, "memory")
			if p := infoField(info.Val(), "maxmemory_policy"); info.Err() == nil && p != "" && p != "noeviction" {
				found = &ConfigError{Addr: f.addr, Err: fmt.Errorf("%w: it is %s", errEviction, p)}
			}
			return nil
		})
	})
	if found != nil {
		f.contact.found(f.logged(found))
	}
}
