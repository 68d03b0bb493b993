package redistest_test

import (
	"context"
	"io"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// client returns a go-redis client of addr, closed when t ends.
func client(t *testing.T, addr string, maxRetries int) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: maxRetries})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestProxyLatency(t *testing.T) {
	s := redistest.Own(t)
	p := redistest.NewProxy(t, s.Addr)
	c := client(t, p.Addr, -1)
	ctx := context.Background()
	require.NoError(t, c.Ping(ctx).Err()) // connected

	ping := func() time.Duration {
		start := time.Now()
		require.NoError(t, c.Ping(ctx).Err())
		return time.Since(start)
	}
	assert.Less(t, ping(), 50*time.Millisecond, "no latency set")

	p.SetLatency(50 * time.Millisecond)
	d := ping()
	assert.GreaterOrEqual(t, d, 100*time.Millisecond, "a round trip pays the latency each way")
	assert.Less(t, d, time.Second)

	// Many commands in flight at once keep their order.
	cmds, err := c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i := range 200 {
			pipe.Echo(ctx, i)
		}
		return nil
	})
	require.NoError(t, err)
	for i, cmd := range cmds {
		assert.Equal(t, strconv.Itoa(i), cmd.(*redis.StringCmd).Val())
	}

	// A new connection pays it through its handshake too.
	start := time.Now()
	require.NoError(t, client(t, p.Addr, -1).Ping(ctx).Err())
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "HELLO and PING")

	p.SetLatency(0)
	assert.Less(t, ping(), 50*time.Millisecond, "latency removed")
}

// TestProxyDropReplies: a lost reply is a closed connection to go-redis,
// after the server ran the command; go-redis retries on EOF, so with its
// default MaxRetries (3) a command whose replies are all lost runs 4 times.
func TestProxyDropReplies(t *testing.T) {
	s := redistest.Own(t)
	direct := client(t, s.Addr, -1)
	ctx := context.Background()

	for _, tc := range []struct {
		maxRetries int
		runs       int64
	}{{-1, 1}, {0, 4}} { // 0: go-redis's default, 3 retries
		p := redistest.NewProxy(t, s.Addr)
		c := client(t, p.Addr, tc.maxRetries)
		require.NoError(t, c.Ping(ctx).Err())
		key := "drop" + time.Now().Format("150405.000000000")
		p.SetDropReplies(1)
		err := c.Incr(ctx, key).Err()
		require.Error(t, err)
		assert.ErrorIs(t, err, io.EOF, "an orderly close, which go-redis retries")
		n, err := direct.Get(ctx, key).Int64()
		require.NoError(t, err)
		assert.Equal(t, tc.runs, n, "times INCR ran, MaxRetries %d", tc.maxRetries)
		assert.Equal(t, tc.runs, p.Dropped())

		p.SetDropReplies(0)
		assert.NoError(t, c.Ping(ctx).Err(), "replies flow again")
	}
}

func TestProxyResetAll(t *testing.T) {
	s := redistest.Own(t)
	p := redistest.NewProxy(t, s.Addr)
	conn, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte("PING\r\n"))
	require.NoError(t, err)
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "+PONG\r\n", string(buf[:n]))

	p.ResetAll()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = conn.Read(buf)
	assert.ErrorIs(t, err, syscall.ECONNRESET)

	assert.NoError(t, client(t, p.Addr, -1).Ping(context.Background()).Err(), "new connections work")
}

func TestProxyRefuse(t *testing.T) {
	s := redistest.Own(t)
	p := redistest.NewProxy(t, s.Addr)
	open := client(t, p.Addr, -1)
	ctx := context.Background()
	require.NoError(t, open.Ping(ctx).Err())

	p.Refuse(true)
	_, err := net.Dial("tcp", p.Addr)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED)
	assert.NoError(t, open.Ping(ctx).Err(), "open connections carry on")

	p.Refuse(false)
	assert.NoError(t, client(t, p.Addr, -1).Ping(ctx).Err())
}

func TestProxySetUpstream(t *testing.T) {
	a, b := redistest.Own(t), redistest.Own(t)
	ctx := context.Background()
	require.NoError(t, client(t, b.Addr, -1).Set(ctx, "where", "b", 0).Err())
	p := redistest.NewProxy(t, a.Addr)
	c := client(t, p.Addr, -1)
	assert.ErrorIs(t, c.Get(ctx, "where").Err(), redis.Nil)

	p.SetUpstream(b.Addr)
	assert.ErrorIs(t, c.Get(ctx, "where").Err(), redis.Nil, "open connections stay on a")
	p.ResetAll()
	var v string
	var err error
	for range 3 { // the pooled connection was reset: go-redis may see that first
		if v, err = c.Get(ctx, "where").Result(); err == nil {
			break
		}
	}
	require.NoError(t, err)
	assert.Equal(t, "b", v)
}

func TestOwnSkewed(t *testing.T) {
	s := redistest.OwnSkewed(t, -time.Hour)
	now, err := client(t, s.Addr, -1).Time(context.Background()).Result()
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now().Add(-time.Hour), now, 5*time.Second)
	t.Run("restart keeps the skew", func(t *testing.T) {
		s.Stop()
		require.NoError(t, s.Restart())
		now, err := client(t, s.Addr, -1).Time(context.Background()).Result()
		require.NoError(t, err)
		assert.WithinDuration(t, time.Now().Add(-time.Hour), now, 5*time.Second)
	})
}
