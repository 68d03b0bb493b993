package bucket_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestLostRepliesAreNotReplayed: through a proxy that drops 30% of the
// replies (the script ran, the client sees its connection closed), no
// reserve takes twice and no refund is applied twice. Before, go-redis sent
// the script again on a new connection: 200 refunds were applied 250 times,
// 200 reserves took 256 tokens for 187 admitted.
func TestLostRepliesAreNotReplayed(t *testing.T) {
	srv := redistest.Own(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr}) // go-redis's default retries
	t.Cleanup(func() { rdb.Close() })
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { direct.Close() })

	lim := bucket.Limit{Rate: 1e-3, Burst: 10000} // refills nothing that counts
	never := gobreaker.Settings{ReadyToTrip: func(gobreaker.Counts) bool { return false }}
	b := bucket.NewRedis(rdb, lim, bucket.WithFailClosed(), bucket.WithRedisBreaker(never))
	reader := bucket.NewRedis(direct, lim, bucket.WithFailClosed())
	ctx := t.Context()
	tokens := func() float64 {
		t.Helper()
		c, err := reader.Tokens(ctx, "k")
		require.NoError(t, err)
		return c[bucket.Requests]
	}
	_, err := b.Reserve(ctx, "k", bucket.N(1), 0) // first contact, before the drops
	require.NoError(t, err)
	before := tokens()
	proxy.SetDropReplies(0.3)

	const calls = 200
	var admitted, failed int
	for range calls {
		r, err := b.Reserve(ctx, "k", bucket.N(1), 0)
		switch {
		case err == nil && r.OK:
			admitted++
		case errors.Is(err, bucket.ErrUnavailable):
			failed++ // taken or not: the reply was lost
		default:
			t.Fatalf("reserve: %v %+v", err, r)
		}
	}
	taken := before - tokens()
	t.Logf("reserves: %d admitted, %d lost replies, %.0f tokens taken, %d replies dropped", admitted, failed, taken, proxy.Dropped())
	require.Positive(t, failed, "the proxy dropped replies")
	assert.GreaterOrEqual(t, taken, float64(admitted)-0.01)
	assert.LessOrEqual(t, taken, float64(admitted+failed)+0.01, "nothing taken twice")

	before = tokens()
	var refunded, lost int
	for range calls {
		err := b.Adjust(ctx, "k", bucket.N(-1))
		switch {
		case err == nil:
			refunded++
		case errors.Is(err, bucket.ErrUnavailable):
			lost++
		default:
			t.Fatalf("adjust: %v", err)
		}
	}
	applied := tokens() - before
	t.Logf("refunds: %d applied, %d lost replies, %.0f tokens given back", refunded, lost, applied)
	assert.GreaterOrEqual(t, applied, float64(refunded)-0.01)
	assert.LessOrEqual(t, applied, float64(refunded+lost)+0.01, "nothing refunded twice")
}

// TestSlowRedisIsNotDown: a Redis at 200 ms RTT is slow but correct. Before,
// a new connection (HELLO, CLIENT SETINFO, the script: 5 round trips at
// first) never finished within the 250 ms per-call timeout, the pool never
// warmed, the breaker flapped, no heartbeat landed, and every process failed
// open at the whole limit (4x the bound with 4 processes); fail-closed, every
// call failed.
func TestSlowRedisIsNotDown(t *testing.T) {
	srv := redistest.Own(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	proxy.SetLatency(100 * time.Millisecond) // each way
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, PoolSize: 8, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	b := bucket.NewRedis(rdb, bucket.PerSecond(1000), bucket.WithFailClosed())

	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 8 {
		wg.Go(func() {
			for range 5 {
				if _, err := b.Reserve(t.Context(), "k", bucket.N(1), 0); err != nil {
					failed.Add(1)
					t.Log(err)
				}
			}
		})
	}
	wg.Wait()
	assert.Zero(t, failed.Load(), "no call taken for an outage")
	tk, err := b.Tokens(t.Context(), "k")
	require.NoError(t, err)
	assert.InDelta(t, 960, tk[bucket.Requests], 40, "40 taken, and a little refilled")
}

// TestLostReplyOpensNoBreaker: a call whose reply is lost (the proxy closes
// its connection after Redis ran it) goes to the share bucket alone; the
// next call goes to Redis, on a new connection. Before, the first lost
// reply opened the breaker, and the process took its share for 500 ms: with
// 30% of replies lost, the fleet lived on shares and was admitted up to
// 1.12 times Burst + Rate·T. A connection that breaks over a second after
// the last call that worked does open it.
func TestLostReplyOpensNoBreaker(t *testing.T) {
	srv := redistest.Own(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	var opened atomic.Int32
	b := bucket.NewRedis(rdb, bucket.PerSecond(1000), bucket.WithRedisBreaker(gobreaker.Settings{
		Timeout: time.Hour, // once open, it stays open for the test
		OnStateChange: func(_ string, _, to gobreaker.State) {
			if to == gobreaker.StateOpen {
				opened.Add(1)
			}
		},
	}))
	ctx := t.Context()
	_, err := b.Reserve(ctx, "k", bucket.N(1), 0) // first contact
	require.NoError(t, err)
	scripts := func() int64 { return scriptsRun(t, srv.Addr, "") }

	for i := range 3 {
		proxy.SetDropReplies(1)
		r, err := b.Reserve(ctx, "k", bucket.N(1), time.Second)
		require.NoError(t, err, "lost reply %d: taken by the share", i)
		require.True(t, r.OK)
		proxy.SetDropReplies(0)
		before := scripts()
		_, err = b.Reserve(ctx, "k", bucket.N(1), time.Second)
		require.NoError(t, err)
		assert.Greater(t, scripts(), before, "after lost reply %d the next call runs on Redis", i)
	}
	assert.Zero(t, opened.Load(), "lost replies alone open no breaker")

	time.Sleep(1100 * time.Millisecond) // no call has worked for over a second
	proxy.SetDropReplies(1)
	_, err = b.Reserve(ctx, "k", bucket.N(1), time.Second)
	require.NoError(t, err)
	proxy.SetDropReplies(0)
	assert.Equal(t, int32(1), opened.Load(), "a broken connection a second after the last call that worked opens it")
}
