package bucket

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a Bucket shared through a Redis server (single node, Sentinel or
// Cluster): every operation is one Lua script, atomic, timed by the server's
// clock only. All dimensions of a key live in one hash slot, so a cost over
// several dimensions is taken all or nothing. Redis is safe for concurrent
// use.
type Redis struct {
	rdb    redis.UniversalClient
	dims   []dim
	prefix string
}

var _ Bucket = (*Redis)(nil)

// NewRedis returns a bucket stored in rdb that limits Requests to limit, and
// each dimension given WithLimit to its own. It makes no call to Redis. It
// panics with a *LimitError if a limit is invalid.
func NewRedis(rdb redis.UniversalClient, limit Limit, opts ...Option) *Redis {
	c, dims := newConfig(limit, opts)
	return &Redis{rdb: rdb, dims: dims, prefix: c.prefix}
}

// Reserve implements Bucket with one call to Redis (or none, if cost charges
// no limited dimension).
func (r *Redis) Reserve(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, error) {
	keys, args, err := r.prepare(key, cost, scriptArg(float64(max(maxWait, 0).Microseconds())), true)
	if err != nil || len(keys) == 0 {
		return Reservation{OK: err == nil}, err
	}
	w, err := reserveScript.Run(ctx, r.rdb, keys, args...).Int64()
	if err != nil {
		return Reservation{}, fmt.Errorf("bucket: redis reserve: %w", err)
	}
	if w < 0 {
		return Reservation{RetryAfter: time.Duration(-w) * time.Microsecond}, nil
	}
	return Reservation{OK: true, Delay: time.Duration(w) * time.Microsecond}, nil
}

// Adjust implements Bucket with one call to Redis.
func (r *Redis) Adjust(ctx context.Context, key string, delta Cost) error {
	keys, args, err := r.prepare(key, delta, smallAmounts[0], false)
	if err != nil || len(keys) == 0 {
		return err
	}
	if err := adjustScript.Run(ctx, r.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("bucket: redis adjust: %w", err)
	}
	return nil
}

// Tokens returns the tokens key has now in each dimension; negative amounts
// are debt owed to reservations.
func (r *Redis) Tokens(ctx context.Context, key string) (Cost, error) {
	keys := make([]string, len(r.dims))
	args := make([]any, 0, 1+3*len(r.dims))
	args = append(args, "0")
	for i, d := range r.dims {
		keys[i] = r.redisKey(key, d.name)
		args = append(args, d.rate, d.burst, "0")
	}
	res, err := tokensScript.Run(ctx, r.rdb, keys, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("bucket: redis tokens: %w", err)
	}
	c := make(Cost, len(r.dims))
	for i, d := range r.dims {
		if c[d.name], err = strconv.ParseFloat(res[i], 64); err != nil {
			return nil, fmt.Errorf("bucket: redis tokens: %w", err)
		}
	}
	return c, nil
}

// prepare builds the KEYS and ARGV of a script for the dimensions cost
// charges. With reserve, amounts are checked against the limits.
func (r *Redis) prepare(key string, cost Cost, arg1 any, reserve bool) ([]string, []any, error) {
	var keys []string
	var args []any
	for i := range r.dims {
		d := &r.dims[i]
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
			keys = make([]string, 0, len(r.dims))
			args = make([]any, 1, 1+3*len(r.dims))
			args[0] = arg1
		}
		keys = append(keys, r.redisKey(key, d.name))
		args = append(args, d.rate, d.burst, scriptArg(v))
	}
	return keys, args, nil
}

// redisKey is <prefix>:{<key>}:<dim>: the braces put every dimension of a
// key in one Cluster hash slot.
func (r *Redis) redisKey(key, dim string) string {
	return r.prefix + ":{" + key + "}:" + dim
}
