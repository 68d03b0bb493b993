package bucket

import (
	"context"
	"errors"
	"math"
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
	// refunds (never above the burst), a positive one debits, into debt if
	// need be, and at most the dimension's burst: no call can cost more, and
	// a usage report beyond it is a lie that would stall the key. A refund
	// is taken to be a served call's (one whose slot came): the waiters
	// queued behind it move up by it (see WaitMax). To give back a
	// reservation whose slot has not come, cancel WaitMax's ctx instead:
	// refunded here, it would move up the waiters queued ahead of it too,
	// admitting its cost early, once.
	Adjust(ctx context.Context, key string, delta Cost) error
	// Observe applies what a response said about the limit to key, for
	// every user of the bucket: a pause for its Retry-After (what is
	// reserved from then on comes after it, at the rate; slots reserved
	// before keep their times, and those due during it count as spent), a
	// rate decrease (once per epoch) when it was throttled, tokens clamped
	// to what the provider reports remaining, the rate capped at what it
	// reports. A window bucket (FixedWindow, SlidingLog) does not adapt,
	// and ignores fb.
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
// reserveAt is Reserve, with the reservation's place in the key's queue
// where the bucket tells it; earliest tells how long until the slot of the
// reservation of cost at that place comes now, or, with no place, until
// cost could be taken if it were reserved now behind every reservation so
// far (the end of the queue), changing nothing; cancel refunds a
// reservation whose slot did not come, taking it out of the queue; and
// refunds signals the refunds made to a key through the bucket.
type moveUp interface {
	reserveAt(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, place, error)
	earliest(ctx context.Context, key string, cost Cost, at place) (time.Duration, error)
	cancel(ctx context.Context, key string, cost Cost) error
	refunds() *refunds
	waiters(key string) *waiters // the gauge that key's waits of reserveAt count in, or nil
}

// minMoveUp is the least wait that may move up.
const minMoveUp = 250 * time.Millisecond

// recheck is how long a waiter whose slot is left off sleeps before it
// reads the slot again unasked, for the refunds of other processes, which
// this one does not hear of: a quarter of left, and at least 2*minMoveUp.
// A wait of 20 s so reads its slot about a dozen times.
func recheck(left time.Duration) time.Duration {
	return max(2*minMoveUp, left/4)
}

// sleepMovingUp sleeps for delay, the reservation's at place, or less if
// a refund to key moves the slot up (see WaitMax).
func sleepMovingUp(ctx context.Context, m moveUp, key string, cost Cost, delay time.Duration, at place) error {
	if delay < minMoveUp {
		return wait.Sleep(ctx, delay)
	}
	rs := m.refunds()
	slot := time.Now().Add(delay)
	t := time.NewTimer(delay)
	defer t.Stop()
	again := time.NewTimer(recheck(delay))
	defer again.Stop()
	for {
		refunded, unwatch := rs.watch(key)
		select {
		case <-ctx.Done():
			unwatch()
			return ctx.Err()
		case <-t.C:
			unwatch()
			return nil
		case <-refunded:
		case <-again.C:
			unwatch()
		}
		if time.Until(slot) < minMoveUp {
			continue // not worth a call: the next refund is watched for, and the timer
		}
		if end, err := m.earliest(ctx, key, cost, at); err == nil {
			if at := time.Now().Add(end); at.Before(slot) {
				slot = at
				t.Reset(time.Until(at))
			}
		}
		again.Reset(recheck(time.Until(slot)))
	}
}

// refunds signals the refunds made to each key to the waiters that watch
// it: a channel per key, closed at the next refund; none for a key that
// nobody watches.
type refunds struct {
	mu sync.Mutex
	m  map[string]*refundWatch
}

type refundWatch struct {
	ch chan struct{}
	n  int // waiters watching ch
}

// watch returns a channel closed at key's next refund, and the function
// to call if the caller stops watching before.
func (r *refunds) watch(key string) (<-chan struct{}, func()) {
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
	return w.ch, func() {
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
		close(w.ch)
		delete(r.m, key)
	}
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
// that used less than it reserved, such as an LLM call's unused
// max_tokens) gives back capacity that the reservations queued behind it
// were not given. A waiter whose slot is that far off asks the bucket,
// with one read, where its slot now is: where the key's tokens, but for
// those reserved after it, come out of debt. So every refund made since it
// reserved, by any process, moves it up by what the refund is worth at the
// key's rate, as if the refunded call had been charged only what it used,
// and the queue keeps its order; a wait cancelled behind it moves it not
// at all. It asks when this process refunds the key through a token bucket
// (Redis, Local, or a Route of them) or tells it of a response that was no
// refusal (Observe), and, for the refunds of the fleet's other processes,
// which this one does not hear of, unasked after a quarter of what is left
// of its wait, and at least half a second after it last asked: a wait of
// 20 s with no refund reads its slot about a dozen times.
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
	var at place
	var err error
	if m != nil {
		r, at, err = m.reserveAt(ctx, key, cost, maxWait)
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
	if m != nil {
		w := m.waiters(key)
		w.sleep(1)
		err = sleepMovingUp(ctx, m, key, cost, r.Delay, at)
		w.sleep(-1)
	} else {
		err = wait.Sleep(ctx, r.Delay)
	}
	if err == nil {
		return r, nil
	}
	// The slot is ours but will not be used: give it back so the next
	// caller can have it. The refund must outlive the cancelled ctx.
	rctx, cancel := wait.Detached(ctx)
	defer cancel()
	var rerr error
	if m != nil {
		rerr = m.cancel(rctx, key, cost)
	} else {
		rerr = b.Adjust(rctx, key, cost.Neg())
	}
	if rerr != nil {
		return r, errors.Join(ctx.Err(), rerr)
	}
	return r, ctx.Err()
}
