package bucket

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/wait"
)

// Bucket is a rate limit shared by everyone who charges the same key.
// Implementations are safe for concurrent use.
type Bucket interface {
	// Reserve takes cost now, or reserves it for the earliest future moment
	// if that is within maxWait (the bucket goes into debt and Delay says how
	// long to wait); otherwise it takes nothing and says when to come back.
	// A cost that can never be admitted fails at once with a *CostError.
	Reserve(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, error)
	// Adjust changes what key has been charged by delta: a negative amount
	// refunds, a positive one debits, into debt if need be; each at most the
	// dimension's burst: no call can cost more, a usage report beyond it is a
	// lie that would stall the key, and a refund beyond it would give back
	// what no call took, moving every waiter up at once. A refund never
	// fills the key above its burst.
	Adjust(ctx context.Context, key string, delta Cost) error
	// Observe applies what a response said about the limit to key, for
	// every user of the bucket: a pause for its Retry-After, or for one
	// window of the limit (at most a second) when a 429 asks for no wait
	// and reports no quota (what is reserved from then on comes after it,
	// at the rate; slots reserved before keep their times, and those due
	// during it count as spent), a rate decrease (once per epoch) when it
	// was throttled; a reported limit, remaining and reset as the
	// provider's bucket, a constraint beside the configured limit (a
	// remaining alone clamps the tokens, a limit alone caps the rate). A
	// window bucket (FixedWindow, SlidingLog) does not adapt, and ignores fb.
	Observe(ctx context.Context, key string, fb adaptive.Feedback) error
}

// Reservation is the outcome of Reserve.
type Reservation struct {
	// OK reports whether the cost was taken, now or for a future slot.
	OK bool
	// Delay is how long the caller must wait, from when Reserve returned,
	// before acting on a reservation that is OK. Zero means now.
	Delay time.Duration
	// RetryAfter is, when OK is false, how long until the cost could be
	// reserved with no wait at all. Zero when OK is true.
	RetryAfter time.Duration
	// Epoch counts key's rate decreases when the reservation was made; pass
	// it back in adaptive.Feedback.Epoch so that a throttled response to
	// this request does not decrease the rate again after a newer decrease.
	// A reservation that a fail-open share made has the largest uint64 (see
	// WithFailOpen).
	Epoch uint64
}

// moveUp is a bucket whose reservations' slots may move up (see WaitMax):
// reserveAt is Reserve for WaitMax, which counts its wait in the waiters
// gauge that waiters returns, and says whether the slot may move up (not
// a fail-open share's, which Redis does not hold) and, where the bucket
// keeps them, its place; earliest reads key's queue for cost, changing
// nothing; refunds signals the refunds made to a key through the bucket;
// and shared tells whether other processes charge key too (their refunds
// are heard of only by reading the queue again).
type moveUp interface {
	reserveAt(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, slotMove, error)
	earliest(ctx context.Context, key string, cost Cost) (queue, error)
	refunds() *refunds
	waiters(key string) *waiters // nil: no metrics
	shared(key string) bool
}

// slotMove says whether a reservation's slot may move up, and on what it
// rests: its place in each token bucket its cost charges (nil where the
// bucket keeps none).
type slotMove struct {
	movable bool
	place   []constraint
}

// queue is a read of a key's queue (moveUp.earliest): end, when the cost
// could be taken if it were reserved now, behind every reservation so far;
// and, where the bucket keeps places, the end and the credit of each token
// bucket the cost charges, in the order of the reservations' places.
type queue struct {
	end  time.Time
	cons []constraint
}

// constraint is a token bucket that a slot rests on, a dimension's own or
// the provider's bucket that a report gave it, as a reservation or a read
// of the queue saw it. at is the slot in it (a reservation's) or the end
// of its queue (a read's); credit is its credit then: what has been added
// to its tokens other than by time, net of every debit and cut (see the
// token bucket scripts); rate its rate in tokens per second; from the end
// of a pause; life changes when the credit starts again; pinned, if not
// zero, when the pin of another process's lower limit that set rate
// lapses (see NewRedis): a slot reckoned at it is to be read again then.
type constraint struct {
	ok       bool // the dimension has this bucket
	at, from time.Time
	credit   int64 // millionths of a token
	rate     float64
	life     string
	pinned   time.Time
}

// movedTo returns the earliest a waiter whose slot is slot, with place pl,
// may go by q: in each token bucket, its slot there, moved up by the credit
// given since it reserved (the refunds of calls served are capacity its
// slot had counted as taken), but not into a pause; or the end of that
// bucket's queue if that is sooner; and the latest of those; in a bucket
// that is gone since, or another life of it, slot. Where either has no places, the end of the
// queue if that is sooner than slot.
//
// This keeps each bucket's bound: what was admitted by any moment t is at
// most its capacity by t, time's (refilled up to the burst) plus the
// credit. Let m be the call admitted by t that reserved last. Everything
// admitted by t reserved before m or is m, so it took at most what was
// reserved up to m less what was given back unserved before m (the
// cancels). m went when the capacity reached that, less the cancels it
// knew of (its slot counted those before it reserved; credits since move
// it up; so does the end of the queue, behind everything reserved), and
// the capacity only grows. The credit counts no unserved refund: one from
// behind m would let m go into capacity that is not there (the review's
// fault, see bucket/movingup_test.go).
func movedTo(slot time.Time, pl []constraint, q queue) time.Time {
	if len(q.cons) == 0 || len(pl) != len(q.cons) {
		if q.end.Before(slot) {
			return q.end
		}
		return slot
	}
	var at time.Time
	for i, c := range q.cons {
		p := pl[i]
		if !c.ok || p.ok && p.life != c.life {
			if p.ok {
				// The bucket its slot rested on is gone (a provider's
				// bucket whose report ran its time, or that a report
				// dropped), or is another one now, which never counted
				// this call: the slot holds.
				at = later(at, slot)
			}
			continue
		}
		s := slot
		if p.ok && p.at.Before(slot) {
			s = p.at
		}
		m := earlier(s, c.at)
		if p.ok && c.credit > p.credit { // of the same life (above)
			if r := max(p.rate, c.rate); r > 0 {
				secs := min(float64(c.credit-p.credit)/1e6/r, 1e6)
				m = earlier(m, later(s.Add(-time.Duration(secs*float64(time.Second))), c.from))
			}
		}
		at = later(at, m)
	}
	return at
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// minMoveUp is the least wait that may move up.
const minMoveUp = 250 * time.Millisecond

// moveUpGrace is how long after the end of the queue a slot moves up to:
// a refund is often seen before the provider has settled the call (it
// settles once it has written the response), and a waiter that went at
// once could reach it first. With none, the openai-go fleet of
// compat/transport's TestSDKFleet drew a 429 in each of five runs; with
// 10 ms, one in four.
const moveUpGrace = 10 * time.Millisecond

// recheck is how long a waiter whose slot is left off sleeps before it
// reads the end of the queue again unasked, for the refunds of other
// processes, which this one does not hear of: a quarter of left, and at
// least 2*minMoveUp. A wait of 20 s so reads it about a dozen times; the
// waiters of a key read it together (see sleepMovingUp).
func recheck(left time.Duration) time.Duration {
	return max(2*minMoveUp, left/4)
}

// sleepMovingUp sleeps for delay, a reservation's, or less if a refund to
// key moves the slot up (see WaitMax).
func sleepMovingUp(ctx context.Context, m moveUp, key string, cost Cost, delay time.Duration, place []constraint) error {
	if delay < minMoveUp {
		return wait.Sleep(ctx, delay)
	}
	rs := m.refunds()
	slot := time.Now().Add(delay)
	t := time.NewTimer(delay)
	defer t.Stop()
	// Only a key that other processes charge is read again unasked: this
	// process hears of each of its own refunds.
	fleet := m.shared(key)
	again := time.NewTimer(recheck(delay))
	defer again.Stop()
	if !fleet {
		again.Stop()
	}
	// A slot reckoned at a pinned limit is read again when the pin lapses
	// (and again then, should it still hold): Redis then reckons the queue
	// at the fleet's own limit.
	lapse := time.NewTimer(Unlimited)
	defer lapse.Stop()
	relapse := func(cs []constraint) {
		if at := pinLapse(cs); !at.IsZero() && at.Before(slot) {
			lapse.Reset(time.Until(at) + moveUpGrace)
		}
	}
	relapse(place)
	class := chargedClass(cost)
	read := func(ctx context.Context) (queue, error) { return m.earliest(ctx, key, cost) }
	first := slot
	for {
		w, unwatch := rs.watch(key)
		var since time.Time
		select {
		case <-ctx.Done():
			unwatch()
			return ctx.Err()
		case <-t.C:
			unwatch()
			return nil
		case <-w.ch:
			since = w.fired // a read begun since the refund tells of it
		case <-again.C:
			// Every waiter of the key reads with this one: a process reads
			// a key's queue unasked at most twice a second.
			rs.wake(key)
			since = w.fired
		case <-lapse.C:
			unwatch()
			since = time.Now() // a read begun after the pin lapsed
		}
		if time.Until(slot) < minMoveUp {
			continue // not worth a call: the next refund is watched for, and the timer
		}
		// A read that outlasts the slot (a slow Redis) must not make the
		// waiter late: it ends there.
		rctx, cancel := context.WithDeadline(ctx, slot)
		q, err := rs.end(rctx, key, class, since, read)
		cancel()
		at := movedTo(first, place, q).Add(moveUpGrace)
		if err == nil && at.Before(slot) {
			slot = at
			t.Reset(time.Until(at))
		}
		relapse(q.cons)
		if fleet {
			again.Reset(recheck(time.Until(slot)))
		}
	}
}

// pinLapse returns the earliest time a pin that holds a bucket of cs
// lapses; the zero time if none holds one.
func pinLapse(cs []constraint) time.Time {
	var at time.Time
	for _, c := range cs {
		if !c.pinned.IsZero() && (at.IsZero() || c.pinned.Before(at)) {
			at = c.pinned
		}
	}
	return at
}

// chargedClass names the dimensions that cost charges: the waiters of a
// key whose costs charge the same share its queue's end.
func chargedClass(cost Cost) string {
	names := make([]string, 0, len(cost))
	for d, v := range cost {
		if v != 0 {
			names = append(names, d)
		}
	}
	slices.Sort(names)
	return strings.Join(names, ",")
}

// refunds signals the refunds made to each key to the waiters that watch
// it: a channel per key, closed at the next refund; none for a key that
// nobody watches. And it shares the waiters' reads of the end of a key's
// queue: those a refund wakes at once make one read, not one each.
type refunds struct {
	mu    sync.Mutex
	m     map[string]*refundWatch
	reads map[string]*endRead // under way, by key and the dimensions charged
}

type refundWatch struct {
	ch    chan struct{}
	n     int       // waiters watching ch
	fired time.Time // when ch was closed
}

// endRead is a read of a key's queue: done is closed once q and err are
// set.
type endRead struct {
	began time.Time
	done  chan struct{}
	q     queue
	err   error
}

// end returns the queue that read reads, from a read of key and class (the
// dimensions charged) begun at since or later: one under way, or a new one.
func (r *refunds) end(ctx context.Context, key, class string, since time.Time, read func(context.Context) (queue, error)) (queue, error) {
	k := key + "\x00" + class
	r.mu.Lock()
	if rd := r.reads[k]; rd != nil && !rd.began.Before(since) {
		r.mu.Unlock()
		select {
		case <-rd.done:
			return rd.q, rd.err
		case <-ctx.Done():
			return queue{}, ctx.Err()
		}
	}
	if r.reads == nil {
		r.reads = make(map[string]*endRead)
	}
	rd := &endRead{began: time.Now(), done: make(chan struct{})}
	r.reads[k] = rd
	r.mu.Unlock()
	rd.q, rd.err = read(ctx)
	close(rd.done)
	r.mu.Lock()
	if r.reads[k] == rd {
		delete(r.reads, k)
	}
	r.mu.Unlock()
	return rd.q, rd.err
}

// watch returns the watch closed at key's next refund, and the function
// to call if the caller stops watching before.
func (r *refunds) watch(key string) (*refundWatch, func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[string]*refundWatch)
	}
	w := r.m[key]
	if w == nil {
		w = &refundWatch{ch: make(chan struct{})}
		r.m[key] = w
	}
	w.n++
	return w, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if w.n--; w.n == 0 && r.m[key] == w {
			delete(r.m, key)
		}
	}
}

// fire wakes key's watchers, if delta refunds anything.
func (r *refunds) fire(key string, delta Cost) {
	refund := false
	for _, v := range delta {
		refund = refund || v < 0
	}
	if refund {
		r.wake(key)
	}
}

// accepted wakes key's watchers when fb tells of a response that was no
// refusal: the fleet's refunds may have moved the queue's end up since
// the last event here.
func (r *refunds) accepted(key string, fb adaptive.Feedback) {
	if fb.Class == adaptive.Accepted {
		r.wake(key)
	}
}

// wake wakes key's watchers.
func (r *refunds) wake(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w := r.m[key]; w != nil {
		w.fired = time.Now()
		close(w.ch)
		delete(r.m, key)
	}
}

// Settler is a Bucket that tells the refunds of served calls from the
// others (see Settle). A wrapper of a Bucket (a ledger, a logger) keeps
// the difference by implementing it with Settle on the bucket it wraps.
type Settler interface {
	Settle(ctx context.Context, key string, delta Cost) error
}

// Settle changes what key has been charged by delta, as b.Adjust does, for a
// call that was served: its slot had come (Wait or WaitMax returned, or a
// Reserve's Delay passed), whether or not it was then sent. A refund so made
// is capacity that every reservation still waiting had counted as taken, and
// on a Redis or Local bucket (or a Route to one) their slots move up by it
// (see WaitMax). A refund through Adjust may be a reservation's that was
// never served, and moves up only the end of the queue: behind the waiters,
// that is where the capacity it gives back lies. Settle is b.Settle where b
// is a Settler, and b.Adjust where not.
func Settle(ctx context.Context, b Bucket, key string, delta Cost) error {
	if s, ok := b.(Settler); ok {
		return s.Settle(ctx, key, delta)
	}
	return b.Adjust(ctx, key, delta)
}

// Unlimited is the maxWait that accepts any delay.
const Unlimited = time.Duration(math.MaxInt64)

// Wait takes cost from key, sleeping until its reserved slot if the bucket
// is empty. It is shorthand for WaitMax(ctx, b, key, cost, Unlimited): the
// wait is bounded only by ctx's deadline.
func Wait(ctx context.Context, b Bucket, key string, cost Cost) (Reservation, error) {
	return WaitMax(ctx, b, key, cost, Unlimited)
}

// WaitMax takes cost from key and sleeps until its reserved slot, making one
// call to the bucket. The wait is bounded by maxWait and by the time left
// until ctx's deadline: if the slot lies beyond, WaitMax fails at once with
// a *WaitError (errors.Is ErrDeadline) and takes nothing. If ctx is done
// while waiting, the cost is refunded and ctx's error returned. Concurrent
// waiters get successive slots and wake one after another.
//
// A slot a quarter of a second off or more may move up: a refund (a call
// that used less than it reserved, such as an LLM call's unused max_tokens)
// gives back capacity that the slots reserved before it did not count on. A
// waiter whose slot is that far off asks the bucket, with one read, where
// the end of the queue now is, and moves its slot up to it if that is
// sooner: it is as if it had reserved anew behind every reservation made so
// far. On Redis and Local (or a Route to them) it also moves up by the
// refunds of calls served (Settle) since it reserved, wherever it is in the
// queue, but never into a pause that came since; a refund through Adjust
// moves up only the end of the queue. It asks when this process refunds the
// key through a token bucket (Redis, Local, or a Route of them) or tells it
// of a response that was no refusal (Observe); and, on Redis, for the
// refunds of the fleet's other processes, which this one does not hear of,
// unasked after a quarter of what is left of its wait and at least half a
// second after it last asked (a wait of 20 s with no refund asks about a
// dozen times). The waiters of a key that one event wakes share one read.
// Before, with every goroutine asleep until its slot, what refunds gave back
// went unused until then. A slot that a fail-open share gave (see
// WithFailOpen) does not move.
func WaitMax(ctx context.Context, b Bucket, key string, cost Cost, maxWait time.Duration) (Reservation, error) {
	if err := ctx.Err(); err != nil {
		return Reservation{}, err
	}
	if maxWait < 0 {
		maxWait = 0
	}
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < maxWait {
			maxWait = max(left, 0)
		}
	}
	m, _ := b.(moveUp)
	var r Reservation
	var err error
	var mv slotMove
	if m != nil {
		r, mv, err = m.reserveAt(ctx, key, cost, maxWait)
	} else {
		r, err = b.Reserve(ctx, key, cost, maxWait)
	}
	if err != nil {
		return r, err
	}
	if !r.OK {
		return r, &WaitError{RetryAfter: r.RetryAfter, MaxWait: maxWait}
	}
	if r.Delay <= 0 {
		return r, nil
	}
	if m == nil {
		err = wait.Sleep(ctx, r.Delay)
	} else {
		w := m.waiters(key)
		w.sleep(1)
		if mv.movable {
			err = sleepMovingUp(ctx, m, key, cost, r.Delay, mv.place)
		} else {
			err = wait.Sleep(ctx, r.Delay)
		}
		w.sleep(-1)
	}
	if err == nil {
		return r, nil
	}
	// The slot is ours but will not be used: give it back so the next
	// caller can have it. The refund must outlive the cancelled ctx.
	rctx, cancel := wait.Detached(ctx)
	defer cancel()
	if rerr := b.Adjust(rctx, key, cost.Neg()); rerr != nil {
		return r, errors.Join(ctx.Err(), rerr)
	}
	return r, ctx.Err()
}
