package bucket_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// assertMisconfigured checks that a failing-open bucket on rdb returns a
// *ConfigError that says hint, naming the server, and logs it at error
// level once; and that it takes nothing.
func assertMisconfigured(t *testing.T, rdb redis.UniversalClient, addr, hint string, opts ...bucket.Option) {
	t.Helper()
	var log syncBuffer
	b := bucket.NewRedis(rdb, bucket.PerSecond(10), append(opts, bucket.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))...)
	for range 3 {
		r, err := b.Reserve(t.Context(), "k", bucket.N(1), time.Second)
		require.ErrorIs(t, err, bucket.ErrMisconfigured, "fail-open must not hide it")
		assert.False(t, errors.Is(err, bucket.ErrUnavailable))
		assert.False(t, r.OK)
		assert.Contains(t, err.Error(), addr)
		assert.Contains(t, err.Error(), hint)
		_, err = bucket.Wait(t.Context(), b, "k", bucket.N(1))
		require.ErrorIs(t, err, bucket.ErrMisconfigured)
	}
	t.Log(log.String())
	assert.Equal(t, 1, strings.Count(log.String(), "level=ERROR"), "logged once")
}

// TestMisconfiguredRedis: errors that no wait cures reach the caller of a
// bucket that fails open, as a *ConfigError. Before, each sent the bucket to
// its share of one member (no heartbeat landed), for ever, silently.
func TestMisconfiguredRedis(t *testing.T) {
	t.Run("WRONGPASS", func(t *testing.T) {
		srv := redistest.Own(t, "--requirepass", "right")
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "wrong"})
		t.Cleanup(func() { rdb.Close() })
		assertMisconfigured(t, rdb, srv.Addr, "check the password")
	})
	t.Run("NOAUTH", func(t *testing.T) {
		srv := redistest.Own(t, "--requirepass", "right")
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { rdb.Close() })
		assertMisconfigured(t, rdb, srv.Addr, "check the password")
	})
	t.Run("NOPERM", func(t *testing.T) {
		srv := redistest.Own(t)
		admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { admin.Close() })
		require.NoError(t, admin.Do(t.Context(), "ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "-evalsha", "-eval").Err())
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "app", Password: "pw"})
		t.Cleanup(func() { rdb.Close() })
		assertMisconfigured(t, rdb, srv.Addr, "grant the ACL user")
	})
	t.Run("READONLY replica", func(t *testing.T) {
		master := redistest.Own(t)
		replica := redistest.Own(t, "--replicaof", "127.0.0.1", strings.TrimPrefix(master.Addr, "127.0.0.1:"))
		rdb := redis.NewClient(&redis.Options{Addr: replica.Addr})
		t.Cleanup(func() { rdb.Close() })
		assertMisconfigured(t, rdb, replica.Addr, "replica's")
	})
	t.Run("READONLY replica, then a timeout", func(t *testing.T) {
		// A call that times out after the replica's READONLY is the
		// misconfiguration still, not an outage to fail open through: on a
		// loaded machine the fault matrix's replica row admitted 128 calls
		// on shares.
		master := redistest.Own(t)
		replica := redistest.Own(t, "--replicaof", "127.0.0.1", strings.TrimPrefix(master.Addr, "127.0.0.1:"))
		proxy := redistest.NewProxy(t, replica.Addr)
		rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { rdb.Close() })
		b := bucket.NewRedis(rdb, bucket.PerSecond(10), bucket.WithRedisTimeout(50*time.Millisecond),
			bucket.WithLogger(slog.New(slog.DiscardHandler)))
		_, err := b.Reserve(t.Context(), "k", bucket.N(1), 0)
		require.ErrorIs(t, err, bucket.ErrMisconfigured)
		proxy.SetLatency(300 * time.Millisecond)
		r, err := b.Reserve(t.Context(), "k", bucket.N(1), time.Second)
		require.ErrorIs(t, err, bucket.ErrMisconfigured, "%+v", r)
		assert.False(t, r.OK)
	})
	for _, policy := range []string{"allkeys-lru", "volatile-ttl", "allkeys-random", "volatile-lfu"} {
		t.Run("maxmemory-policy "+policy, func(t *testing.T) {
			srv := redistest.Own(t, "--maxmemory", "64mb", "--maxmemory-policy", policy)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { rdb.Close() })
			assertMisconfigured(t, rdb, srv.Addr, "maxmemory-policy noeviction")

			allowed := bucket.NewRedis(rdb, bucket.PerSecond(10), bucket.WithEvictionAllowed())
			r, err := allowed.Reserve(t.Context(), "k", bucket.N(1), 0)
			require.NoError(t, err)
			assert.True(t, r.OK)
		})
	}
	t.Run("maxmemory-policy changed while running", func(t *testing.T) {
		srv := redistest.Own(t)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { rdb.Close() })
		b := bucket.NewRedis(rdb, bucket.PerSecond(1000), bucket.WithLogger(slog.New(slog.DiscardHandler)),
			bucket.WithPolicyCheckEvery(100*time.Millisecond))
		_, err := b.Reserve(t.Context(), "k", bucket.N(1), 0)
		require.NoError(t, err)
		require.NoError(t, rdb.ConfigSet(t.Context(), "maxmemory-policy", "allkeys-lru").Err())
		require.Eventually(t, func() bool {
			_, err := b.Reserve(t.Context(), "k", bucket.N(1), 0)
			return errors.Is(err, bucket.ErrMisconfigured)
		}, 5*time.Second, 20*time.Millisecond, "read again")
	})
	t.Run("fixed, the server is used without a restart", func(t *testing.T) {
		srv := redistest.Own(t, "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { rdb.Close() })
		b := bucket.NewRedis(rdb, bucket.PerSecond(10), bucket.WithLogger(slog.New(slog.DiscardHandler)))
		_, err := b.Reserve(t.Context(), "k", bucket.N(1), 0)
		require.ErrorIs(t, err, bucket.ErrMisconfigured)
		require.NoError(t, rdb.ConfigSet(t.Context(), "maxmemory-policy", "noeviction").Err())
		require.Eventually(t, func() bool {
			r, err := b.Reserve(t.Context(), "k", bucket.N(1), 0)
			return err == nil && r.OK
		}, 15*time.Second, 100*time.Millisecond, "checked again within 10 s")
	})
}
