package bucket_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestRedisKeysAndTTL pins the storage layout under controlled time: one
// hash per key and dimension in one hash slot, time kept as exact integer
// microseconds, a TTL covering refill and debt, idle keys gone.
func TestRedisKeysAndTTL(t *testing.T) {
	ctx := context.Background()
	srv := newClockedRedis(t, epoch)
	b := bucket.NewRedis(srv.rdb, bucket.Limit{Rate: 2, Burst: 10},
		bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 100, Burst: 1000}), bucket.WithPrefix("app"),
		bucket.WithFailClosed()) // no membership set (TestFleetMembers): the bucket's own keys only

	_, err := b.Reserve(ctx, "k", bucket.Cost{bucket.Requests: 4, bucket.Tokens: 500}, 0)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"app:{k}:requests", "app:{k}:tokens"}, srv.Keys())
	h := srv.HGet("app:{k}:requests", "ts")
	assert.Equal(t, strconv.FormatInt(epoch.UnixMicro(), 10), h, "time kept to the microsecond at today's epoch")
	// The TTL covers the refill (4 tokens at 2/s: 2 s) plus a second, and
	// is set past that by one full refill time (10/2 = 5 s) so that a hot
	// key is not re-expired on every call.
	assertTTL(t, srv, "app:{k}:requests", 3*time.Second, 8*time.Second)
	assertTTL(t, srv, "app:{k}:tokens", 6*time.Second, 16*time.Second)

	// Debt lengthens the need: from -4 to 10 tokens is 7 s of refill.
	r, err := b.Reserve(ctx, "k", bucket.N(11), time.Hour)
	require.Error(t, err, "cost above burst")
	assert.False(t, r.OK)
	r, err = b.Reserve(ctx, "k", bucket.N(10), time.Hour)
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, r.Delay)
	assertTTL(t, srv, "app:{k}:requests", 8*time.Second, 8*time.Second)
	r, err = b.Reserve(ctx, "k", bucket.N(2), time.Hour) // 9 s of refill: extended
	require.NoError(t, err)
	assert.Equal(t, 3*time.Second, r.Delay)
	assertTTL(t, srv, "app:{k}:requests", 10*time.Second, 15*time.Second)

	// One microsecond later, the refill is exact.
	srv.clock.Set(epoch.Add(time.Microsecond))
	tk, err := b.Tokens(ctx, "k")
	require.NoError(t, err)
	assert.InDelta(t, -6+2e-6, tk[bucket.Requests], 1e-12)

	// Idle keys disappear.
	srv.clock.Advance(17 * time.Second)
	assert.Empty(t, srv.Keys())

	// A refund to a full bucket leaves no key behind.
	require.NoError(t, b.Adjust(ctx, "k", bucket.N(-1)))
	assert.Empty(t, srv.Keys())
}

// assertTTL checks that key's TTL is within [lo, hi] (PEXPIREAT rounds the
// expiry up to the millisecond).
func assertTTL(t *testing.T, srv *clockedRedis, key string, lo, hi time.Duration) {
	t.Helper()
	ttl := srv.TTL(key)
	assert.GreaterOrEqual(t, ttl, lo, key)
	assert.LessOrEqual(t, ttl, hi+time.Millisecond, key)
}

// TestRedisLuaOnRealServer checks the Lua interpreter's number formatting
// and TIME on a server with the real clock.
func TestRedisLuaOnRealServer(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t)
	b := bucket.NewRedis(rdb, bucket.Limit{Rate: 2, Burst: 10})
	key := uniqueKey(t)
	before := time.Now()
	r, err := b.Reserve(ctx, key, bucket.N(4), 0)
	require.NoError(t, err)
	require.True(t, r.OK)

	rk := "sluice:{" + key + "}:requests"
	ts, err := rdb.HGet(ctx, rk, "ts").Int64()
	require.NoError(t, err, "ts must be an integer, not a float in %%.14g")
	assert.InDelta(t, before.UnixMicro(), ts, float64(time.Second.Microseconds()))
	ttl := rdb.PTTL(ctx, rk).Val()
	assert.InDelta(t, 8*time.Second.Seconds(), ttl.Seconds(), 0.05, "refill 2 s + 1 s + slack 5 s")

	r, err = b.Reserve(ctx, key, bucket.N(10), time.Hour)
	require.NoError(t, err)
	assert.InDelta(t, 2*time.Second.Seconds(), r.Delay.Seconds(), 0.05)
	tk, err := b.Tokens(ctx, key)
	require.NoError(t, err)
	assertRefilledSince(t, -4, tk[bucket.Requests], 2, before)

	require.NoError(t, b.Adjust(ctx, key, bucket.N(-10)))
	tk, err = b.Tokens(ctx, key)
	require.NoError(t, err)
	assertRefilledSince(t, 6, tk[bucket.Requests], 2, before)
}

// assertRefilledSince asserts that got is want plus what a key refilling
// at rate a second may have gained since start (on a loaded machine, tens
// of milliseconds pass between the calls: 0.06 tokens at 2/s was seen).
func assertRefilledSince(t *testing.T, want, got, rate float64, start time.Time) {
	t.Helper()
	assert.GreaterOrEqual(t, got, want-0.01)
	assert.LessOrEqual(t, got, want+rate*time.Since(start).Seconds()+0.01)
}

// TestRedisErrorsAreWrapped: a Redis failure comes back as an error, never
// as an admission.
func TestRedisErrorsAreWrapped(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	b := bucket.NewRedis(rdb, bucket.PerSecond(20), bucket.WithFailClosed())
	r, err := b.Reserve(context.Background(), "k", bucket.N(1), 0)
	assert.ErrorContains(t, err, "bucket: redis reserve")
	assert.False(t, r.OK)
	assert.ErrorContains(t, b.Adjust(context.Background(), "k", bucket.N(1)), "bucket: redis adjust")
}

// TestRedisKilledMidRun: while its Redis is down a bucket that fails closed
// fails every call with an error (it never admits blindly), and it works
// again once the server is back.
func TestRedisKilledMidRun(t *testing.T) {
	srv := redistest.Own(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	b := bucket.NewRedis(rdb, bucket.PerSecond(100), bucket.WithFailClosed())
	ctx := context.Background()

	r, err := b.Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	require.True(t, r.OK)

	srv.Stop()
	r, err = b.Reserve(ctx, "k", bucket.N(1), 0)
	assert.ErrorContains(t, err, "bucket: redis reserve")
	assert.False(t, r.OK)
	_, err = bucket.Wait(ctx, b, "k", bucket.N(1))
	assert.Error(t, err)

	require.NoError(t, srv.Restart())
	require.Eventually(t, func() bool {
		r, err := b.Reserve(ctx, "k", bucket.N(1), 0)
		return err == nil && r.OK
	}, 5*time.Second, 50*time.Millisecond)
}
