package bucket

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

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
	windowed
}

var _ Bucket = (*FixedWindow)(nil)

// NewFixedWindow returns a fixed-window bucket stored in rdb that limits
// Requests to limit, and each dimension given WithLimit to its own. It
// makes no call to Redis. It panics with a *LimitError if a limit is
// invalid.
func NewFixedWindow(rdb redis.UniversalClient, limit Limit, opts ...Option) *FixedWindow {
	return &FixedWindow{newWindowed(rdb, limit, opts, ":window")}
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
	return f.adjust(ctx, fixedAdjustScript, key, delta, nil)
}

// Tokens returns what is left of the current window's allowance in each
// dimension; negative amounts were debited past it.
func (f *FixedWindow) Tokens(ctx context.Context, key string) (Cost, error) {
	return f.tokens(ctx, fixedTokensScript, key)
}

// windowed is what FixedWindow and SlidingLog share: the dimensions, each
// with its window of Burst/Rate, and the Redis key layout.
type windowed struct {
	rdb    redis.UniversalClient
	dims   []dim
	window []string // window length of dims[i] in microseconds, formatted
	prefix string
	suffix string // after the dimension: one key type per algorithm
}

// maxWindow caps a window at 2^52 µs (142 years), so that window numbers
// and bounds at today's time stay exact integers in a Lua double.
const maxWindow = 1 << 52

func newWindowed(rdb redis.UniversalClient, limit Limit, opts []Option, suffix string) windowed {
	c, dims := newConfig(limit, opts)
	w := windowed{rdb: rdb, dims: dims, window: make([]string, len(dims)), prefix: c.prefix, suffix: suffix}
	for i, d := range dims {
		w.window[i] = strconv.FormatInt(windowMicros(d.limit), 10)
	}
	return w
}

// windowMicros is the length of l's window, Burst/Rate seconds, in whole
// microseconds: at least 1, at most maxWindow.
func windowMicros(l Limit) int64 {
	us := math.Round(l.Burst / l.Rate * 1e6)
	return int64(min(max(us, 1), maxWindow))
}

// redisKey is <prefix>:{<key>}:<dim><suffix>: the braces put every
// dimension of a key in one Cluster hash slot.
func (w *windowed) redisKey(key, dim string) string {
	return w.prefix + ":{" + key + "}:" + dim + w.suffix
}

// prepare builds the KEYS and ARGV of a script for the dimensions cost
// charges: ARGV is head, then window, burst and amount for each key. With
// reserve, amounts are checked against the limits.
func (w *windowed) prepare(key string, cost Cost, reserve bool, head ...any) ([]string, []any, error) {
	var keys []string
	var args []any
	for i := range w.dims {
		d := &w.dims[i]
		v, ok := cost[d.name]
		if !ok || v == 0 {
			continue
		}
		if reserve {
			if err := d.checkCost(v); err != nil {
				return nil, nil, err
			}
		} else if err := checkDelta(d.name, v); err != nil {
			return nil, nil, err
		}
		if keys == nil {
			keys = make([]string, 0, len(w.dims))
			args = make([]any, 0, len(head)+3*len(w.dims))
			args = append(args, head...)
		}
		keys = append(keys, w.redisKey(key, d.name))
		args = append(args, w.window[i], d.burst, scriptArg(v))
	}
	return keys, args, nil
}

// reserve runs a reserve script, whose ARGV are maxWait in microseconds,
// extra, then the triples of prepare, and which replies {1, delay} or
// {0, retryAfter} in microseconds.
func (w *windowed) reserve(ctx context.Context, s *redis.Script, key string, cost Cost, maxWait time.Duration, extra ...any) (Reservation, error) {
	head := append([]any{strconv.FormatInt(max(maxWait, 0).Microseconds(), 10)}, extra...)
	keys, args, err := w.prepare(key, cost, true, head...)
	if err != nil || len(keys) == 0 {
		return Reservation{OK: err == nil}, err
	}
	res, err := s.Run(ctx, w.rdb, keys, args...).Int64Slice()
	if err != nil {
		return Reservation{}, fmt.Errorf("bucket: redis reserve: %w", err)
	}
	if len(res) != 2 {
		return Reservation{}, fmt.Errorf("bucket: redis reserve: unexpected reply %v", res)
	}
	wait := time.Duration(res[1]) * time.Microsecond
	if res[0] == 1 {
		return Reservation{OK: true, Delay: wait}, nil
	}
	return Reservation{RetryAfter: wait}, nil
}

// adjust runs an adjust script, whose ARGV are head, then the triples of
// prepare.
func (w *windowed) adjust(ctx context.Context, s *redis.Script, key string, delta Cost, head []any) error {
	keys, args, err := w.prepare(key, delta, false, head...)
	if err != nil || len(keys) == 0 {
		return err
	}
	if err := s.Run(ctx, w.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("bucket: redis adjust: %w", err)
	}
	return nil
}

// tokens runs a tokens script over every dimension. Its ARGV are the
// triples of prepare with amount 0, and it replies with each key's
// remaining allowance as a string.
func (w *windowed) tokens(ctx context.Context, s *redis.Script, key string) (Cost, error) {
	keys := make([]string, len(w.dims))
	args := make([]any, 0, 3*len(w.dims))
	for i, d := range w.dims {
		keys[i] = w.redisKey(key, d.name)
		args = append(args, w.window[i], d.burst, "0")
	}
	res, err := s.Run(ctx, w.rdb, keys, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("bucket: redis tokens: %w", err)
	}
	if len(res) != len(w.dims) {
		return nil, fmt.Errorf("bucket: redis tokens: unexpected reply %v", res)
	}
	c := make(Cost, len(w.dims))
	for i, d := range w.dims {
		if c[d.name], err = strconv.ParseFloat(res[i], 64); err != nil {
			return nil, fmt.Errorf("bucket: redis tokens: %w", err)
		}
	}
	return c, nil
}
