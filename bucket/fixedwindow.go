package bucket

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/adaptive"

	"github.com/redis/go-redis/v9"
)

// FixedWindow is a Bucket that counts cost in fixed windows aligned to the
// Unix epoch, shared through Redis. A Limit allows Burst per window of
// Burst/Rate seconds: PerMinute(500) allows 500 in each clock minute, from
// :00 to the end of :59.
//
// It matches providers that reset their counters at aligned boundaries (an
// x-ratelimit-reset at the top of the minute). Like them, it admits up to
// 2·Burst within one window's length across a boundary: Burst at the end of
// a window, Burst again at the start of the next. Compare Redis, the token
// bucket, for providers that refill continuously (up to 2·Burst within one
// aligned window: a full bucket, then its refill), and SlidingLog, for
// providers that count over a rolling window (never more than Burst in any
// window).
//
// A cost that does not fit the current window is reserved in the first
// later window with room, and Delay is the time until that window opens.
// Every operation is one Lua script timed by Redis TIME only. Each key and
// dimension is one hash, <prefix>:{<key>}:<dimension>:window, counting cost
// by window number; it expires when the last window it counts ends, plus a
// second. FixedWindow is safe for concurrent use.
type FixedWindow struct {
	scripted
}

var _ Bucket = (*FixedWindow)(nil)

// NewFixedWindow returns a fixed-window bucket stored in rdb that limits
// Requests to limit, and each dimension given WithLimit to its own. It
// makes no call to Redis. It panics with a *LimitError if a limit is
// invalid.
func NewFixedWindow(rdb redis.UniversalClient, limit Limit, opts ...Option) *FixedWindow {
	f := &FixedWindow{newScripted(rdb, forWindow, "NewFixedWindow", limit, opts, ":window", windowParam)}
	f.debit = func(ctx context.Context, key string, c Cost) error {
		return f.adjustWith(ctx, fixedAdjustScript, key, c, true)
	}
	f.meter(func(ctx context.Context, key string) (Cost, Cost, error) {
		return f.tokens(ctx, fixedTokensScript, key)
	})
	return f
}

// Reserve implements Bucket with one call to Redis (or none, if cost
// charges no limited dimension). The cost is taken from the current window
// if every dimension has room for it there; otherwise from the first later
// window, opening within maxWait, that has room in every dimension.
func (f *FixedWindow) Reserve(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, error) {
	return f.reserve(ctx, fixedReserveScript, key, cost, maxWait)
}

// Adjust implements Bucket with one call to Redis. A debit is counted in the
// current window, past its allowance if need be. A refund is taken off the
// latest window that counts anything, then the ones before it down to the
// current window, never below zero: it frees the slot that a cancelled wait
// reserved, or that a call which used less than it reserved was counted in.
func (f *FixedWindow) Adjust(ctx context.Context, key string, delta Cost) error {
	return f.adjust(ctx, fixedAdjustScript, key, delta)
}

// Tokens returns what is left of the current window's allowance in each
// dimension; negative amounts were debited past it.
func (f *FixedWindow) Tokens(ctx context.Context, key string) (Cost, error) {
	tokens, _, err := f.tokens(ctx, fixedTokensScript, key)
	return tokens, err
}

// maxWindow caps a window at 2^52 µs (142 years), so that window numbers
// and bounds at today's time stay exact integers in a Lua double.
const maxWindow = 1 << 52

// windowParam is the scripts' number for a windowed limit: its window in
// microseconds.
func windowParam(d dim) any { return strconv.FormatInt(windowMicros(d.limit), 10) }

// windowMicros is the length of l's window, Burst/Rate seconds, in whole
// microseconds: at least 1, at most maxWindow.
func windowMicros(l Limit) int64 {
	us := math.Round(l.Burst / l.Rate * 1e6)
	return int64(min(max(us, 1), maxWindow))
}

// Observe implements Bucket. A window counter mirrors a limit the provider
// states exactly, so it does not adapt: Observe changes nothing, not even
// a pause. A slot that comes due during a pause its caller knows of, and
// that the caller drops, is still counted; a refund would not give it back,
// but free the newest reservation, whose holder still sends (the
// transport does not refund it). Use the token bucket (NewRedis, NewLocal)
// to learn a limit from responses.
func (f *FixedWindow) Observe(context.Context, string, adaptive.Feedback) error { return nil }
