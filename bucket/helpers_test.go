package bucket_test

import (
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/bucket"
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
// with a fake clock, and Redis on miniredis, whose TIME the test sets.
func backends(t *testing.T) []*controlled {
	clk := &fakeClock{t: epoch}
	local := &controlled{name: "local", advance: clk.Advance}
	local.new = func(t *testing.T, l bucket.Limit, opts ...bucket.Option) bucket.Bucket {
		b := bucket.NewLocal(l, append(opts, bucket.WithClock(clk))...)
		local.tokens = func(_ *testing.T, key string) bucket.Cost { return b.Tokens(key) }
		return b
	}

	mr := miniredis.RunT(t)
	mr.SetTime(epoch)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	now := epoch
	mini := &controlled{name: "miniredis", advance: func(d time.Duration) {
		now = now.Add(d)
		mr.SetTime(now)
		mr.FastForward(d) // expire keys
	}}
	mini.new = func(t *testing.T, l bucket.Limit, opts ...bucket.Option) bucket.Bucket {
		b := bucket.NewRedis(rdb, l, opts...)
		mini.tokens = func(t *testing.T, key string) bucket.Cost {
			c, err := b.Tokens(t.Context(), key)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		return b
	}
	return []*controlled{local, mini}
}
