package bucket_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// epoch is a moment of today's magnitude: 1.8e15 µs, beyond the 14 digits
// that Lua's tostring keeps.
var epoch = time.Date(2026, 11, 30, 12, 0, 0, 123456000, time.UTC)

// assertConserved checks the fleet invariant on a key saturated for span:
// what was admitted is at most Burst + Rate·span (plus one for the
// measurement of span) and at least 95% of it. what names the run in the
// log.
func assertConserved(t *testing.T, lim bucket.Limit, admitted int64, span time.Duration, what string) {
	t.Helper()
	bound := lim.Burst + lim.Rate*span.Seconds()
	t.Logf("%s: admitted %d, bound %.1f (%.1f%%)", what, admitted, bound, 100*float64(admitted)/bound)
	assert.LessOrEqual(t, float64(admitted), bound+1)
	assert.GreaterOrEqual(t, float64(admitted), 0.95*bound)
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// controlled is a bucket whose clock the test drives.
type controlled struct {
	name    string
	new     func(t *testing.T, l bucket.Limit, opts ...bucket.Option) bucket.Bucket
	advance func(d time.Duration)
	tokens  func(t *testing.T, key string) bucket.Cost
}

// backends returns the token bucket backends under controlled time: Local
// with a fake clock, and Redis on a real redis-server whose wall clock
// (TIME, and the expiry of keys) the test sets.
func backends(t *testing.T) []*controlled {
	clk := &fakeClock{t: epoch}
	local := &controlled{name: "local", advance: clk.Advance}
	local.new = func(t *testing.T, l bucket.Limit, opts ...bucket.Option) bucket.Bucket {
		b := bucket.NewLocal(l, append(opts, bucket.WithClock(clk))...)
		local.tokens = func(_ *testing.T, key string) bucket.Cost { return b.Tokens(key) }
		return b
	}

	cr := newClockedRedis(t, epoch)
	rs := &controlled{name: "redis", advance: cr.clock.Advance}
	rs.new = func(t *testing.T, l bucket.Limit, opts ...bucket.Option) bucket.Bucket {
		// These tests compare the law, not timeouts: a call that a loaded
		// machine delays past the default 250 ms must not fail, or fall
		// to a share. A test's own WithRedisTimeout comes later and wins.
		opts = append([]bucket.Option{bucket.WithRedisTimeout(5 * time.Second)}, opts...)
		b := bucket.NewRedis(cr.rdb, l, opts...)
		rs.tokens = func(t *testing.T, key string) bucket.Cost {
			c, err := b.Tokens(t.Context(), key)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		return b
	}
	return []*controlled{local, rs}
}

// clockedRedis is a redis-server of a test's own whose wall clock is
// frozen at the start the test gives and moves only with clock, with a
// client and what a test reads of the keyspace. The readers fail the test
// (not at once) on an error.
//
// Unlike miniredis, which these tests ran on before, Redis deletes a key
// only once the clock is a millisecond past its expiry (see
// redistest.Clock).
type clockedRedis struct {
	t     testing.TB
	clock *redistest.Clock
	rdb   *redis.Client
}

func newClockedRedis(t testing.TB, start time.Time) *clockedRedis {
	t.Helper()
	srv, clock := redistest.Clocked(t, start)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	return &clockedRedis{t: t, clock: clock, rdb: rdb}
}

// check notes err, if any, as a failure of the test.
func (c *clockedRedis) check(err error) {
	if err != nil && err != redis.Nil {
		c.t.Errorf("redis: %v", err)
	}
}

// Keys returns the names of the keys that have not expired, sorted.
func (c *clockedRedis) Keys() []string {
	keys, err := c.rdb.Keys(context.Background(), "*").Result()
	c.check(err)
	slices.Sort(keys)
	return keys
}

// HGet returns a field of a hash, or "" if there is none.
func (c *clockedRedis) HGet(key, field string) string {
	v, err := c.rdb.HGet(context.Background(), key, field).Result()
	c.check(err)
	return v
}

// HKeys returns the fields of a hash.
func (c *clockedRedis) HKeys(key string) ([]string, error) {
	return c.rdb.HKeys(context.Background(), key).Result()
}

// TTL returns what is left of a key's time to live (PTTL), or 0 if it has
// no expiry or does not exist.
func (c *clockedRedis) TTL(key string) time.Duration {
	ttl, err := c.rdb.PTTL(context.Background(), key).Result()
	c.check(err)
	return max(ttl, 0)
}

// Exists reports whether a key exists (and has not expired).
func (c *clockedRedis) Exists(key string) bool {
	n, err := c.rdb.Exists(context.Background(), key).Result()
	c.check(err)
	return n == 1
}

// SortedSet returns a sorted set's members and their scores.
func (c *clockedRedis) SortedSet(key string) (map[string]float64, error) {
	z, err := c.rdb.ZRangeWithScores(context.Background(), key, 0, -1).Result()
	if err != nil {
		return nil, err
	}
	set := make(map[string]float64, len(z))
	for _, m := range z {
		set[m.Member.(string)] = m.Score
	}
	return set, nil
}

// ZMembers returns a sorted set's members, lowest score first.
func (c *clockedRedis) ZMembers(key string) ([]string, error) {
	return c.rdb.ZRange(context.Background(), key, 0, -1).Result()
}

// FlushAll deletes every key.
func (c *clockedRedis) FlushAll() {
	c.check(c.rdb.FlushAll(context.Background()).Err())
}
