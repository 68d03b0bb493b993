package bucket

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/adaptive"

	"github.com/redis/go-redis/v9"
)

// SlidingLog is a Bucket that logs every admission in Redis and admits a
// cost only if no window of Burst/Rate seconds, wherever it starts, would
// then hold more than Burst: PerMinute(500) allows 500 in any 60 seconds.
//
// It matches providers that count over a rolling window. It is the strict
// one of the three: it never admits more than Burst in any window, where
// Redis (the token bucket, for providers that refill continuously) admits
// up to 2·Burst within one aligned window and FixedWindow (for providers
// that reset at aligned boundaries) up to 2·Burst across a boundary. The
// price is memory: one entry per admission that still counts, where the
// others keep a few numbers per key; Reserve reads all of a key's entries.
//
// A cost that does not fit now is reserved for the moment enough earlier
// entries stop counting, and Delay is the time until then; reservations
// queue in order. Every operation is one Lua script timed by Redis TIME
// only. Each key and dimension is one sorted set,
// <prefix>:{<key>}:<dimension>:log, of admissions scored by their moment;
// it expires a second after its newest entry stops counting. SlidingLog is
// safe for concurrent use.
type SlidingLog struct {
	scripted
	idPrefix string        // random, tells this SlidingLog's entries from others'
	seq      atomic.Uint64 // numbers its calls
}

var _ Bucket = (*SlidingLog)(nil)

// NewSlidingLog returns a sliding-log bucket stored in rdb that limits
// Requests to limit, and each dimension given WithLimit to its own. It
// makes no call to Redis. It panics with a *LimitError if a limit is
// invalid.
func NewSlidingLog(rdb redis.UniversalClient, limit Limit, opts ...Option) *SlidingLog {
	var b [9]byte
	rand.Read(b[:]) // never returns an error
	s := &SlidingLog{
		scripted: newScripted(rdb, forWindow, "NewSlidingLog", limit, opts, ":log", windowParam),
		idPrefix: base64.RawURLEncoding.EncodeToString(b[:]) + ".",
	}
	s.debit = func(ctx context.Context, key string, c Cost) error {
		return s.adjustWith(ctx, slidingAdjustScript, key, c, true, s.nextID())
	}
	s.meter(func(ctx context.Context, key string) (Cost, Cost, error) {
		return s.tokens(ctx, slidingTokensScript, key)
	})
	return s
}

// Reserve implements Bucket with one call to Redis (or none, if cost
// charges no limited dimension). The cost is taken at the earliest moment,
// within maxWait, at which no window holding it would exceed a burst in any
// dimension.
func (s *SlidingLog) Reserve(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, error) {
	return s.reserve(ctx, slidingReserveScript, key, cost, maxWait, s.nextID())
}

// Adjust implements Bucket with one call to Redis. A debit is logged at the
// current moment, past the burst if need be. A refund is taken off the
// newest entries first, future reservations included: it frees the slot
// that a cancelled wait reserved, or the last one logged.
func (s *SlidingLog) Adjust(ctx context.Context, key string, delta Cost) error {
	return s.adjust(ctx, slidingAdjustScript, key, delta, s.nextID())
}

// Tokens returns what a cost could take now in each dimension: the burst
// minus the entries that count in the window ending now, reservations for
// later moments included. Negative amounts were debited past the burst.
func (s *SlidingLog) Tokens(ctx context.Context, key string) (Cost, error) {
	tokens, _, err := s.tokens(ctx, slidingTokensScript, key)
	return tokens, err
}

// nextID returns an id no other call uses: a log entry is "<id>:<amount>".
func (s *SlidingLog) nextID() string {
	return s.idPrefix + strconv.FormatUint(s.seq.Add(1), 36)
}

// Observe implements Bucket. A window counter mirrors a limit the provider
// states exactly, so it does not adapt: Observe changes nothing, not even
// a pause. A slot that comes due during a pause its caller knows of, and
// that the caller drops, is still counted; a refund would not give it back,
// but free the newest reservation, whose holder still sends (the
// transport does not refund it). Use the token bucket (NewRedis, NewLocal)
// to learn a limit from responses.
func (s *SlidingLog) Observe(context.Context, string, adaptive.Feedback) error { return nil }
