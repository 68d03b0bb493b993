package bucket

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// scripted is what the Redis-backed buckets share: the client, the
// dimensions, each with the number its scripts read first (the token
// bucket's rate, a window's length), and the key layout.
type scripted struct {
	rdb    redis.UniversalClient
	dims   []dim
	param  []any // per dimension, formatted
	prefix string
	suffix string // after the dimension: one key type per algorithm
}

func newScripted(rdb redis.UniversalClient, limit Limit, opts []Option, suffix string, param func(Limit) any) scripted {
	c, dims := newConfig(limit, opts)
	s := scripted{rdb: rdb, dims: dims, param: make([]any, len(dims)), prefix: c.prefix, suffix: suffix}
	for i, d := range dims {
		s.param[i] = param(d.limit)
	}
	return s
}

// redisKey is <prefix>:{<key>}:<dim><suffix>: the braces put every
// dimension of a key in one Cluster hash slot.
func (s *scripted) redisKey(key, dim string) string {
	return s.prefix + ":{" + key + "}:" + dim + s.suffix
}

// prepare builds the KEYS and ARGV of a script for the dimensions cost
// charges: ARGV is head, then param, burst and amount for each key. With
// reserve, amounts are checked against the limits.
func (s *scripted) prepare(key string, cost Cost, reserve bool, head ...any) ([]string, []any, error) {
	var keys []string
	var args []any
	for i := range s.dims {
		d := &s.dims[i]
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
			keys = make([]string, 0, len(s.dims))
			args = make([]any, 0, len(head)+3*len(s.dims))
			args = append(args, head...)
		}
		keys = append(keys, s.redisKey(key, d.name))
		args = append(args, s.param[i], d.burst, scriptArg(v))
	}
	return keys, args, nil
}

// reserve runs a reserve script, whose ARGV are maxWait in microseconds,
// extra, then the triples of prepare. The script replies with the wait in
// microseconds, negated if it took nothing (a refused wait is always > 0).
func (s *scripted) reserve(ctx context.Context, script *redis.Script, key string, cost Cost, maxWait time.Duration, extra ...any) (Reservation, error) {
	head := append([]any{scriptArg(float64(max(maxWait, 0).Microseconds()))}, extra...)
	keys, args, err := s.prepare(key, cost, true, head...)
	if err != nil || len(keys) == 0 {
		return Reservation{OK: err == nil}, err
	}
	w, err := script.Run(ctx, s.rdb, keys, args...).Int64()
	if err != nil {
		return Reservation{}, fmt.Errorf("bucket: redis reserve: %w", err)
	}
	if w < 0 {
		return Reservation{RetryAfter: time.Duration(-w) * time.Microsecond}, nil
	}
	return Reservation{OK: true, Delay: time.Duration(w) * time.Microsecond}, nil
}

// adjust runs an adjust script, whose ARGV are head, then the triples of
// prepare.
func (s *scripted) adjust(ctx context.Context, script *redis.Script, key string, delta Cost, head ...any) error {
	keys, args, err := s.prepare(key, delta, false, head...)
	if err != nil || len(keys) == 0 {
		return err
	}
	if err := script.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("bucket: redis adjust: %w", err)
	}
	return nil
}

// tokens runs a tokens script over every dimension. Its ARGV are head, then
// the triples of prepare with amount 0, and it replies with each key's
// tokens or remaining allowance as a string.
func (s *scripted) tokens(ctx context.Context, script *redis.Script, key string, head ...any) (Cost, error) {
	keys := make([]string, len(s.dims))
	args := make([]any, 0, len(head)+3*len(s.dims))
	args = append(args, head...)
	for i, d := range s.dims {
		keys[i] = s.redisKey(key, d.name)
		args = append(args, s.param[i], d.burst, smallAmounts[0])
	}
	res, err := script.Run(ctx, s.rdb, keys, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("bucket: redis tokens: %w", err)
	}
	if len(res) != len(s.dims) {
		return nil, fmt.Errorf("bucket: redis tokens: unexpected reply %v", res)
	}
	c := make(Cost, len(s.dims))
	for i, d := range s.dims {
		if c[d.name], err = strconv.ParseFloat(res[i], 64); err != nil {
			return nil, fmt.Errorf("bucket: redis tokens: %w", err)
		}
	}
	return c, nil
}
