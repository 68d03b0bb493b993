package transport_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/transport"
)

// benchGoroutines is how many goroutines each benchmark runs.
const benchGoroutines = 8

// BenchmarkRoundTrip measures, in one run and against one loopback server:
// a bare http.Transport; sluice over it with a Local bucket; sluice with a
// Redis bucket; and one Redis round trip (PING), the overhead the Redis
// bucket is allowed. Limits are too high to throttle: this is the cost of
// the machinery. Each reports p50 latency as p50-ns.
func BenchmarkRoundTrip(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, `{"ok":true}`)
	}))
	defer srv.Close()
	newBase := func() *http.Transport {
		return &http.Transport{MaxIdleConns: 4 * benchGoroutines, MaxIdleConnsPerHost: 4 * benchGoroutines}
	}
	huge := bucket.Limit{Rate: 1e12, Burst: 1e12}

	b.Run("bare", func(b *testing.B) {
		base := newBase()
		defer base.CloseIdleConnections()
		benchParallel(b, roundTrip(base, srv.URL))
	})
	b.Run("local", func(b *testing.B) {
		base := newBase()
		defer base.CloseIdleConnections()
		tr := transport.New(base, transport.WithBucket(bucket.NewLocal(huge)))
		benchParallel(b, roundTrip(tr, srv.URL))
	})
	b.Run("redis", func(b *testing.B) {
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: 2 * benchGoroutines})
		defer rdb.Close()
		base := newBase()
		defer base.CloseIdleConnections()
		key := fmt.Sprintf("bench-%d", time.Now().UnixNano())
		tr := transport.New(base, transport.WithBucket(bucket.NewRedis(rdb, huge)),
			transport.WithKey(func(*http.Request) string { return key }))
		benchParallel(b, roundTrip(tr, srv.URL))
	})
	b.Run("redis-reserve", func(b *testing.B) {
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: 2 * benchGoroutines})
		defer rdb.Close()
		bk := bucket.NewRedis(rdb, huge)
		key := fmt.Sprintf("bench-%d", time.Now().UnixNano())
		benchParallel(b, func() error {
			_, err := bk.Reserve(context.Background(), key, bucket.N(1), bucket.Unlimited)
			return err
		})
	})
	b.Run("redis-ping", func(b *testing.B) {
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: 2 * benchGoroutines})
		defer rdb.Close()
		benchParallel(b, func() error { return rdb.Ping(context.Background()).Err() })
	})
}

func roundTrip(rt http.RoundTripper, url string) func() error {
	return func() error {
		req, err := http.NewRequest("GET", url, nil)
		if err != nil {
			return err
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
}

// benchParallel runs op from benchGoroutines goroutines and reports the
// median latency of one op.
func benchParallel(b *testing.B, op func() error) {
	if err := op(); err != nil { // warm up: connections, scripts
		b.Fatal(err)
	}
	b.SetParallelism((benchGoroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	var (
		mu  sync.Mutex
		all []time.Duration
	)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		lat := make([]time.Duration, 0, 4096)
		for pb.Next() {
			start := time.Now()
			if err := op(); err != nil {
				b.Error(err)
				return
			}
			lat = append(lat, time.Since(start))
		}
		mu.Lock()
		all = append(all, lat...)
		mu.Unlock()
	})
	b.StopTimer()
	if len(all) > 0 {
		slices.Sort(all)
		b.ReportMetric(float64(all[len(all)/2].Nanoseconds()), "p50-ns")
	}
}
