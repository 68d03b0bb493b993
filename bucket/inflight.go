package bucket

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/wait"
)

// Semaphore bounds how many calls are in flight at once on a key.
// Implementations are safe for concurrent use.
type Semaphore interface {
	// Acquire takes one of key's slots, waiting for one to be free; the
	// callers get them in the order they came. It returns the function that
	// gives the slot back, to be called once the call is over (calling it
	// again does nothing). If ctx ends first, Acquire takes nothing and
	// returns ctx's error.
	Acquire(ctx context.Context, key string) (release func(), err error)
}

// Bounds of an InFlight.
const (
	// maxInFlight is the largest n: a limit beyond it is no limit.
	maxInFlight = 1 << 20
	// defaultLease is how long a slot outlives the process that holds it.
	// A lease is renewed every third of it, so it must outlast two renewals
	// that fail or come late (a Redis call times out after 250 ms, a
	// breaker period is 500 ms, a GC pause or a throttled container stalls
	// a process for 100 ms periods) by a wide margin; and it is the longest
	// the fleet goes without the slots of a process that died, next to
	// calls of seconds to minutes. It matches how long a silent process
	// counts as a member of the fleet (memberTTL).
	defaultLease = 10 * time.Second
	minLease     = time.Second
	maxLease     = 10 * time.Minute
)

// WithLease sets how long an InFlight's slot outlives the process that
// holds it (10 s by default; d = 0 keeps it): a process renews the leases
// of its slots, and of its places in the queue, every d/3, in one call to
// Redis per key; the slots of a process that dies (or stalls for longer
// than d) are free within d. It panics if d is not 0 and not between 1 s
// and 10 min.
func WithLease(d time.Duration) Option {
	if d != 0 && (d < minLease || d > maxLease) {
		panic(fmt.Sprintf("bucket: WithLease(%v): a lease is between %v and %v", d, minLease, maxLease))
	}
	return option{"WithLease", forFlight, func(c *config) {
		if d != 0 {
			c.lease = d
		}
	}}
}

// InFlight is a Semaphore shared through Redis (single node, Sentinel or
// Cluster): at most n calls are in flight on a key across every process
// of the fleet. Each operation is one Lua script, atomic, timed by Redis
// TIME only, on three sorted sets in the key's hash slot:
// <prefix>:{<key>}/inflight holds the slots, each a member
// "<pid>.<instance>/<seq>" scored by the end of its lease, and
// <prefix>:{<key>}/inflight/queue and /inflight/waiting the callers
// waiting, in order, and their leases. Every script first frees the slots
// and places whose lease has ended, and hands the free slots to the head of
// the queue; the keys expire a second after the last lease they hold.
//
// Waiting does not poll. A caller that finds no slot free joins the queue;
// a slot given back goes, in the same script, to the head of the queue, and
// the waiter's process is told on its own Pub/Sub channel,
// <prefix>:inflight:<pid>.<instance>, which it subscribes to on its first
// wait (one connection per InFlight, closed once nothing has been held or
// waited for during a second, or a third of the lease if that is shorter). The lease renewals, every third of a lease, also tell a process
// which of its waiters hold a slot, should a message be lost; and a
// process with waiters calls when the first lease of a holder ends, so a
// dead process's slot goes to the queue on time. A cancelled waiter leaves
// the queue (the slot, if it came meanwhile, goes on to the next).
//
// If Redis is unavailable (see WithFailOpen), a call takes a slot of this
// process's share, n divided by the live members of the fleet (at least
// one), counting the calls this process has in flight on Redis slots too:
// the fleet stays within n in flight, or one per process if it has more
// processes than n. Waiters queued on Redis move to the share when a
// renewal finds Redis unavailable, and waiters on the share go back to
// Redis once it serves again. With WithFailClosed they fail with an
// *UnavailableError instead. A misconfigured Redis (see ConfigError)
// returns its error. The slots taken meanwhile are added to Redis by the
// next renewal, which states every slot this process holds, past n if
// need be: Redis counts what is in flight, and admits no more until it is
// below n again.
//
// A Redis that restarted empty has lost the holders while their calls go
// on: a server grants no slot until a renewal has passed since it started
// (a third of the lease, in whole seconds, and a second more), by when
// each live holder has stated its slots again; the first slots after a
// server starts wait up to that long.
//
// Processes of a fleet must agree on n and the lease for a key: each
// script applies the n and lease of the process that runs it. Redis Ring
// is not supported: its Pub/Sub does not reach across shards.
//
// InFlight is safe for concurrent use.
type InFlight struct {
	rdb    redis.UniversalClient
	n      int
	lease  time.Duration
	prefix string
	inst   string // "<pid>.<random>": this InFlight's members and channel
	chans  string // the channel prefix, "<prefix>:inflight:"
	head   []any  // every script's first ARGV: n, chans, lease in µs
	fo     *failover
	seq    atomic.Uint64
	linger time.Duration // how long the keeper stays once nothing is held

	subMu sync.Mutex // held while subscribing

	mu      sync.Mutex
	keys    map[string]*flightKey    // by holders' key name
	waiters map[string]*flightWaiter // queued on Redis, by member
	keeping bool                     // a keeper runs
	kick    chan struct{}            // wakes the keeper
	ps      *redis.PubSub            // nil: not subscribed
	down    bool                     // the last call found Redis unavailable
	back    chan struct{}            // closed when Redis serves again after down
	isDown  atomic.Bool              // down, read without mu
}

var _ Semaphore = (*InFlight)(nil)

// flightKey is what this process holds and waits for on one key.
type flightKey struct {
	keys    []string // holders, queue, waiting
	users   int      // Acquire calls under way
	held    map[string]struct{}
	waiting map[string]*flightWaiter // queued on Redis
	shareQ  []*flightWaiter          // queued for a slot of the share, in order
	renewAt time.Time
	sweepAt time.Time // zero: none due
}

// flightWaiter is one caller waiting, on Redis or for the share. Once it
// is decided (held, or err set), under InFlight.mu, done is closed.
type flightWaiter struct {
	m    string
	k    *flightKey
	done chan struct{}
	held bool
	err  error
}

func (w *flightWaiter) decided() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// NewInFlight returns a Semaphore stored in rdb that lets at most n calls
// be in flight on a key. It makes no call to Redis. It takes the options
// WithPrefix, WithLease, WithFailOpen (the default), WithFailClosed,
// WithRedisTimeout, WithRedisBreaker, WithEvictionAllowed and WithLogger,
// and panics if n is not between 1 and 2^20, if rdb is a *redis.Ring, or
// if another option is given.
func NewInFlight(rdb redis.UniversalClient, n int, opts ...Option) *InFlight {
	if n < 1 || n > maxInFlight {
		panic(fmt.Sprintf("bucket: NewInFlight(n = %d): n is between 1 and %d", n, maxInFlight))
	}
	if _, ok := rdb.(*redis.Ring); ok {
		panic("bucket: NewInFlight does not take a *redis.Ring: its Pub/Sub does not reach across shards")
	}
	c := config{backend: forFlight}
	c.applyOptions("NewInFlight", opts)
	if strings.ContainsAny(c.prefix, "{}") {
		panic(fmt.Sprintf("bucket: prefix %q holds a brace: it would choose the Cluster hash slot", c.prefix))
	}
	if c.lease == 0 {
		c.lease = defaultLease
	}
	var b [6]byte
	rand.Read(b[:]) // never returns an error
	f := &InFlight{rdb: rdb, n: n, lease: c.lease, prefix: c.prefix,
		inst: strconv.Itoa(os.Getpid()) + "." + hex.EncodeToString(b[:]), chans: c.prefix + ":inflight:",
		fo: newFailover(rdb, c, nil), linger: min(c.lease/3, time.Second),
		keys: map[string]*flightKey{}, waiters: map[string]*flightWaiter{}, kick: make(chan struct{}, 1),
		back: make(chan struct{})}
	close(f.back)
	f.head = []any{strconv.Itoa(n), f.chans, strconv.FormatInt(c.lease.Microseconds(), 10)}
	return f
}

// Acquire implements Semaphore: one call to Redis to take a free slot
// (two, and a subscription, the first time this InFlight waits), one to
// join the queue, and a message on this InFlight's channel when the slot
// comes. The release function makes one call to Redis, within the Redis
// timeout, detached from ctx; if it fails, the lease frees the slot.
func (f *InFlight) Acquire(ctx context.Context, key string) (func(), error) {
	if key == "" {
		return nil, ErrInvalidKey
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	k := f.enter(f.prefix + ":{" + keyTag(key) + "}/inflight")
	defer f.exit(k)
	for {
		release, again, err := f.acquire(ctx, k)
		if !again {
			return release, err
		}
	}
}

// acquire tries Redis for a slot of k; if Redis is unavailable and the
// bucket fails open, the share. again reports that Redis served again
// while it waited for the share: try it again.
func (f *InFlight) acquire(ctx context.Context, k *flightKey) (release func(), again bool, err error) {
	m := f.member()
	if !f.subscribed() {
		held, _, err := f.take(ctx, k, m, false)
		if err != nil {
			return f.failed(ctx, k, m, err)
		}
		if held {
			return f.holding(k, m), false, nil
		}
		if err := f.subscribe(ctx); err != nil {
			return f.failed(ctx, k, "", err)
		}
	}
	w := &flightWaiter{m: m, k: k, done: make(chan struct{})}
	f.mu.Lock()
	k.waiting[m], f.waiters[m] = w, w
	f.mu.Unlock()
	held, sweep, err := f.take(ctx, k, m, true)
	if err != nil || held {
		f.mu.Lock()
		if !w.decided() {
			f.dropLocked(k, w)
		}
		f.mu.Unlock()
		if w.held || err == nil {
			return f.holding(k, m), false, nil
		}
		return f.failed(ctx, k, m, err)
	}
	f.schedule(k, sweep)
	select {
	case <-w.done:
	case <-ctx.Done():
		f.mu.Lock()
		decided := w.decided()
		if !decided {
			f.dropLocked(k, w)
		}
		f.mu.Unlock()
		if decided && w.held {
			f.release(k, m) // to the next in the queue
		} else if !decided {
			f.leaveDetached(ctx, k, m)
		}
		return nil, false, ctx.Err()
	}
	if w.held {
		return f.holding(k, m), false, nil
	}
	return f.failed(ctx, k, "", w.err)
}

// failed handles err, which a call to Redis for k returned; m, if not "",
// is the member it may have queued or given a slot (a context that ended
// while the call was under way: the script may have run). A cancelled
// context is the caller's; a Redis unavailable, failing open, sends the
// call to the share.
func (f *InFlight) failed(ctx context.Context, k *flightKey, m string, err error) (func(), bool, error) {
	var ue *UnavailableError
	switch {
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		if m != "" {
			f.leaveDetached(ctx, k, m)
		}
		return nil, false, err
	case errors.As(err, &ue) && f.fo.open:
		// A member the lost reply of a call may have queued is left to
		// its lease; should Redis give it a slot, the message finds no
		// waiter, and the slot is given back (dispatch).
		return f.share(ctx, k)
	case errors.As(err, &ue), errors.Is(err, ErrMisconfigured):
		return nil, false, err
	}
	if m != "" {
		f.leaveDetached(ctx, k, m)
	}
	return nil, false, fmt.Errorf("bucket: redis in-flight: %w", err)
}

// share takes a slot of this process's share of k while Redis is
// unavailable, in the order the callers came: while fewer than the share
// are in flight on k here, slots taken on Redis included.
func (f *InFlight) share(ctx context.Context, k *flightKey) (func(), bool, error) {
	m := f.member()
	f.mu.Lock()
	if len(k.shareQ) == 0 && len(k.held) < f.shareSize() {
		k.held[m] = struct{}{}
		f.mu.Unlock()
		return f.releaser(k, m), false, nil
	}
	w := &flightWaiter{m: m, k: k, done: make(chan struct{})}
	k.shareQ = append(k.shareQ, w)
	back := f.back
	f.mu.Unlock()
	var cause error
	select {
	case <-w.done:
		return f.releaser(k, m), false, nil
	case <-back:
	case <-ctx.Done():
		cause = ctx.Err()
	}
	f.mu.Lock()
	decided := w.decided()
	if !decided {
		k.shareQ = removeWaiter(k.shareQ, w)
	}
	f.mu.Unlock()
	switch {
	case decided && cause == nil:
		return f.releaser(k, m), false, nil
	case decided:
		f.release(k, m)
	case cause == nil:
		return nil, true, nil // Redis is back
	}
	return nil, false, cause
}

// shareSize is this process's share of n: n over the fleet's live
// members, at least one.
func (f *InFlight) shareSize() int {
	return max(1, f.n/int(max(min(f.fo.members.Load(), maxMembers), 1)))
}

func removeWaiter(q []*flightWaiter, w *flightWaiter) []*flightWaiter {
	for i, x := range q {
		if x == w {
			return append(q[:i], q[i+1:]...)
		}
	}
	return q
}

// holding records that this process holds m's slot of k, and returns the
// function that releases it.
func (f *InFlight) holding(k *flightKey, m string) func() {
	f.mu.Lock()
	k.held[m] = struct{}{}
	f.mu.Unlock()
	return f.releaser(k, m)
}

func (f *InFlight) releaser(k *flightKey, m string) func() {
	var once sync.Once
	return func() { once.Do(func() { f.release(k, m) }) }
}

// release gives m's slot of k back: to the share's next waiter, if any and
// the share allows, and to Redis, within the Redis timeout (if that fails,
// the lease frees it).
func (f *InFlight) release(k *flightKey, m string) {
	f.mu.Lock()
	delete(k.held, m)
	for len(k.shareQ) > 0 && len(k.held) < f.shareSize() {
		w := k.shareQ[0]
		k.shareQ = k.shareQ[1:]
		k.held[w.m] = struct{}{}
		w.held = true
		close(w.done)
	}
	f.forgetLocked(k)
	f.mu.Unlock()
	f.leaveDetached(context.Background(), k, m)
}

// leaveDetached runs the leave script for members of k under a context
// detached from ctx. A failure is left to the leases.
func (f *InFlight) leaveDetached(ctx context.Context, k *flightKey, members ...string) {
	lctx, cancel := wait.Detached(ctx)
	defer cancel()
	f.leave(lctx, k.keys, members...)
}

func (f *InFlight) leave(ctx context.Context, keys []string, members ...string) {
	args := append(append(make([]any, 0, len(f.head)+len(members)), f.head...), strArgs(members)...)
	_ = f.call(ctx, flightLeaveScript, keys, args...).Err()
}

func strArgs(s []string) []any {
	a := make([]any, len(s))
	for i, v := range s {
		a[i] = v
	}
	return a
}

// take runs the acquire script for m on k, queueing it if queue. It
// reports whether m holds a slot, and if not, how long until the first
// holder's lease ends (0: unknown).
func (f *InFlight) take(ctx context.Context, k *flightKey, m string, queue bool) (held bool, sweep time.Duration, err error) {
	q := "0"
	if queue {
		q = "1"
	}
	args := append(append(make([]any, 0, len(f.head)+2), f.head...), m, q)
	v, err := f.call(ctx, flightAcquireScript, k.keys, args...).Int64Slice()
	if err != nil {
		return false, 0, err
	}
	if len(v) != 2 || v[0] != 0 && v[0] != 1 || v[1] < 0 {
		return false, 0, fmt.Errorf("unexpected reply %v", v)
	}
	return v[0] == 1, micros(v[1]), nil
}

// call runs s through the failure policy, and notes whether Redis served.
func (f *InFlight) call(ctx context.Context, s *script, keys []string, args ...any) *redis.Cmd {
	cmd := f.fo.run(ctx, s, keys, args...)
	var ue *UnavailableError
	switch err := cmd.Err(); {
	case err == nil:
		if f.isDown.Load() {
			f.up()
		}
	case errors.As(err, &ue):
		f.markDown()
	}
	return cmd
}

// markDown records that Redis is unavailable: the share's waiters wait
// for back to close.
func (f *InFlight) markDown() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.down {
		f.down, f.back = true, make(chan struct{})
		f.isDown.Store(true)
	}
}

// up records that Redis serves again: the share's waiters go back to it,
// and every key is renewed at once, which adds to Redis the slots taken
// from the share.
func (f *InFlight) up() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.down {
		return
	}
	f.down = false
	f.isDown.Store(false)
	close(f.back)
	now := time.Now()
	for _, k := range f.keys {
		k.renewAt = now
	}
	f.wake()
}

func (f *InFlight) wake() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// member returns a new member name of this InFlight.
func (f *InFlight) member() string {
	return f.inst + "/" + strconv.FormatUint(f.seq.Add(1), 10)
}

// enter returns the state of the key whose holders' set is h, counting a
// caller in, and makes sure a keeper runs.
func (f *InFlight) enter(h string) *flightKey {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.keys[h]
	if k == nil {
		k = &flightKey{keys: []string{h, h + "/queue", h + "/waiting"}, held: map[string]struct{}{},
			waiting: map[string]*flightWaiter{}, renewAt: time.Now().Add(f.lease / 3)}
		f.keys[h] = k
	}
	k.users++
	if !f.keeping {
		f.keeping = true
		go f.keep()
	}
	return k
}

func (f *InFlight) exit(k *flightKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k.users--
	f.forgetLocked(k)
}

// forgetLocked drops k once nothing is held, waited for or under way on it.
func (f *InFlight) forgetLocked(k *flightKey) {
	if k.users == 0 && len(k.held) == 0 && len(k.waiting) == 0 && len(k.shareQ) == 0 && f.keys[k.keys[0]] == k {
		delete(f.keys, k.keys[0])
		if len(f.keys) == 0 {
			f.wake()
		}
	}
}

// dropLocked removes w, undecided, from the waiters of k on Redis.
func (f *InFlight) dropLocked(k *flightKey, w *flightWaiter) {
	delete(k.waiting, w.m)
	delete(f.waiters, w.m)
}

// decideLocked gives w, waiting on Redis for k, its slot (err nil) or err.
func (f *InFlight) decideLocked(k *flightKey, w *flightWaiter, err error) {
	f.dropLocked(k, w)
	if err == nil {
		k.held[w.m] = struct{}{}
		w.held = true
	}
	w.err = err
	close(w.done)
}

// schedule has the keeper renew k when the first holder's lease ends,
// sweep from now, if that is before its next call.
func (f *InFlight) schedule(k *flightKey, sweep time.Duration) {
	if sweep <= 0 {
		return
	}
	at := time.Now().Add(min(sweep, f.lease) + time.Millisecond)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(k.waiting) > 0 && (k.sweepAt.IsZero() || at.Before(k.sweepAt)) {
		k.sweepAt = at
		f.wake()
	}
}

func (f *InFlight) subscribed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ps != nil
}

// subscribe subscribes to this InFlight's channel, once: the grants of its
// waiters come there.
func (f *InFlight) subscribe(ctx context.Context) error {
	f.subMu.Lock()
	defer f.subMu.Unlock()
	if f.subscribed() {
		return nil
	}
	var ps *redis.PubSub
	err := f.fo.do(ctx, func(ctx context.Context) error {
		ps = f.rdb.Subscribe(ctx, f.chans+f.inst)
		// Confirmed before anything is queued: a grant published before
		// the subscription is lost.
		v, err := ps.ReceiveTimeout(ctx, f.fo.callTimeout())
		if err != nil {
			return err
		}
		if _, ok := v.(*redis.Subscription); !ok {
			return fmt.Errorf("unexpected reply %v", v)
		}
		return nil
	})
	if err != nil {
		if ps != nil {
			ps.Close()
		}
		var ue *UnavailableError
		if errors.As(err, &ue) {
			f.markDown()
		}
		return err
	}
	// go-redis reconnects and subscribes again after a broken connection,
	// and pings an idle one; what is published meanwhile is lost, and the
	// renewals find it.
	ch := ps.Channel(redis.WithChannelHealthCheckInterval(max(f.lease/3, time.Second)), redis.WithChannelSize(1024))
	f.mu.Lock()
	f.ps = ps
	f.mu.Unlock()
	go func() {
		for msg := range ch {
			f.dispatch(msg.Payload)
		}
	}()
	return nil
}

// dispatch acts on a message of this InFlight's channel, "<member> <key>":
// the waiter gets its slot; a slot for a member that waits no more (it was
// cancelled, or went to the share) is given back at once.
func (f *InFlight) dispatch(payload string) {
	m, h, ok := strings.Cut(payload, " ")
	if !ok || !strings.HasPrefix(m, f.inst+"/") || !strings.HasPrefix(h, f.prefix+":{") || !strings.HasSuffix(h, "}/inflight") {
		return
	}
	f.mu.Lock()
	if w := f.waiters[m]; w != nil {
		f.decideLocked(w.k, w, nil)
		f.mu.Unlock()
		return
	}
	if k := f.keys[h]; k != nil {
		if _, held := k.held[m]; held {
			f.mu.Unlock()
			return // a renewal told first
		}
	}
	f.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait.DetachedTimeout)
		defer cancel()
		f.leave(ctx, []string{h, h + "/queue", h + "/waiting"}, m)
	}()
}

// keep renews the leases of every key this InFlight holds or waits on,
// every third of a lease, and when a holder's lease ends while it waits;
// it ends, closing the subscription, once nothing has been held or waited
// for during linger.
func (f *InFlight) keep() {
	t := time.NewTimer(f.linger)
	defer t.Stop()
	var idle time.Time
	for {
		now := time.Now()
		next := now.Add(f.lease / 3)
		var due []*flightKey
		f.mu.Lock()
		if len(f.keys) == 0 {
			if idle.IsZero() {
				idle = now
			}
			if now.Sub(idle) >= f.linger {
				f.keeping = false
				ps := f.ps
				f.ps = nil
				f.mu.Unlock()
				if ps != nil {
					ps.Close()
				}
				return
			}
			next = idle.Add(f.linger)
		} else {
			idle = time.Time{}
		}
		for _, k := range f.keys {
			at := k.renewAt
			if !k.sweepAt.IsZero() && k.sweepAt.Before(at) {
				at = k.sweepAt
			}
			if !at.After(now) {
				due = append(due, k)
			} else if at.Before(next) {
				next = at
			}
		}
		f.mu.Unlock()
		if len(due) > 0 {
			for _, k := range due {
				f.renew(k)
			}
			continue
		}
		t.Reset(time.Until(next))
		select {
		case <-t.C:
		case <-f.kick:
		}
	}
}

// renew renews the leases of what this process holds and waits for on k,
// in one call: it learns which waiters hold a slot now, when the first
// holder's lease ends, and whether Redis is unavailable (the waiters then
// go to the share, or fail).
func (f *InFlight) renew(k *flightKey) {
	f.mu.Lock()
	k.renewAt, k.sweepAt = time.Now().Add(f.lease/3), time.Time{}
	args := append(make([]any, 0, len(f.head)+1+len(k.held)+len(k.waiting)), f.head...)
	args = append(args, strconv.Itoa(len(k.held)))
	members := make([]string, 0, len(k.held)+len(k.waiting))
	for m := range k.held {
		members = append(members, m)
	}
	waiters := make([]*flightWaiter, 0, len(k.waiting))
	for _, w := range k.waiting {
		waiters = append(waiters, w)
		members = append(members, w.m)
	}
	f.mu.Unlock()
	if len(members) == 0 {
		return
	}
	args = append(args, strArgs(members)...)
	ctx := context.Background()
	v, err := f.call(ctx, flightRenewScript, k.keys, args...).Int64Slice()
	if err == nil && len(v) != len(waiters)+1 {
		err = fmt.Errorf("unexpected reply %v", v)
	}
	var ue *UnavailableError
	if err != nil {
		if errors.As(err, &ue) || errors.Is(err, ErrMisconfigured) {
			f.mu.Lock()
			for _, w := range waiters {
				if !w.decided() {
					f.decideLocked(k, w, err)
				}
			}
			f.mu.Unlock()
		}
		return
	}
	var stale []string // left while the renewal ran, and perhaps put back by it
	f.mu.Lock()
	for i, w := range waiters {
		if v[i] == 1 && !w.decided() {
			f.decideLocked(k, w, nil)
		}
	}
	for _, m := range members {
		_, held := k.held[m]
		if w := k.waiting[m]; !held && w == nil {
			stale = append(stale, m)
		}
	}
	if s := v[len(v)-1]; s > 0 && len(k.waiting) > 0 {
		k.sweepAt = time.Now().Add(min(micros(s), f.lease) + time.Millisecond)
	}
	f.mu.Unlock()
	if len(stale) > 0 {
		f.leave(ctx, k.keys, stale...)
	}
}

// Held returns how many of key's slots are held across the fleet now.
func (f *InFlight) Held(ctx context.Context, key string) (int, error) {
	if key == "" {
		return 0, ErrInvalidKey
	}
	h := f.prefix + ":{" + keyTag(key) + "}/inflight"
	n, err := f.call(ctx, flightHeldScript, []string{h, h + "/queue", h + "/waiting"}, f.head...).Int()
	if err != nil {
		return 0, fmt.Errorf("bucket: redis in-flight held: %w", err)
	}
	return n, nil
}
