package bucket

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a Bucket shared through a Redis server (single node, Sentinel or
// Cluster): every operation is one Lua script, atomic, timed by the server's
// clock only. All dimensions of a key live in one hash slot, so a cost over
// several dimensions is taken all or nothing. Redis is safe for concurrent
// use.
type Redis struct {
	scripted
}

var _ Bucket = (*Redis)(nil)

// NewRedis returns a bucket stored in rdb that limits Requests to limit, and
// each dimension given WithLimit to its own. It makes no call to Redis. It
// panics with a *LimitError if a limit is invalid.
func NewRedis(rdb redis.UniversalClient, limit Limit, opts ...Option) *Redis {
	return &Redis{newScripted(rdb, limit, opts, "", func(l Limit) any { return scriptArg(l.Rate) })}
}

// Reserve implements Bucket with one call to Redis (or none, if cost charges
// no limited dimension).
func (r *Redis) Reserve(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, error) {
	return r.reserve(ctx, reserveScript, key, cost, maxWait)
}

// Adjust implements Bucket with one call to Redis.
func (r *Redis) Adjust(ctx context.Context, key string, delta Cost) error {
	return r.adjust(ctx, adjustScript, key, delta, smallAmounts[0])
}

// Tokens returns the tokens key has now in each dimension; negative amounts
// are debt owed to reservations.
func (r *Redis) Tokens(ctx context.Context, key string) (Cost, error) {
	return r.tokens(ctx, tokensScript, key, smallAmounts[0])
}
