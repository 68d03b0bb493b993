package transport_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/transport"
)

// benchGoroutines are the concurrencies each case runs at: 8, the
// acceptance figure, and 1, where the machine is not CPU-bound and latency
// is the sum of the round trips.
var benchGoroutines = []int{8, 1}

// maxGoroutines sizes connection pools.
const maxGoroutines = 8

// BenchmarkRoundTrip measures, in one run and against one loopback server:
// a bare http.Transport; sluice over it with a Local bucket; sluice with a
// Redis bucket, and with one that leases (WithLeasing); a bare round trip
// preceded by a Redis PING, which is what the Redis case may cost at most;
// a Reserve alone; a PING alone. Limits are too high to throttle: this is
// the cost of the machinery. Each reports p50 latency as p50-ns, and the
// CPU this process spent per op (client and HTTP server) as cpu-us/op; a
// case that calls Redis also reports redis-server's CPU per op
// (redis-cpu-us/op, from INFO cpu) and, if it runs scripts, their calls
// per op (scripts/op, from INFO commandstats). On two cores latency
// follows the CPU a request costs in all three.
func BenchmarkRoundTrip(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, `{"ok":true}`)
	}))
	defer srv.Close()
	newBase := func() *http.Transport {
		return &http.Transport{MaxIdleConns: 4 * maxGoroutines, MaxIdleConnsPerHost: 4 * maxGoroutines}
	}
	huge := bucket.Limit{Rate: 1e9, Burst: 1e9}
	for _, g := range benchGoroutines {
		b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) { benchRoundTrip(b, srv.URL, g, newBase, huge) })
	}
}

func benchRoundTrip(b *testing.B, url string, g int, newBase func() *http.Transport, huge bucket.Limit) {
	b.Run("bare", func(b *testing.B) {
		base := newBase()
		defer base.CloseIdleConnections()
		benchParallel(b, g, roundTrip(base, url))
	})
	b.Run("local", func(b *testing.B) {
		base := newBase()
		defer base.CloseIdleConnections()
		tr := transport.New(base, transport.WithBucket(bucket.NewLocal(huge)))
		benchParallel(b, g, roundTrip(tr, url))
	})
	b.Run("redis", func(b *testing.B) {
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: 2 * maxGoroutines})
		defer rdb.Close()
		base := newBase()
		defer base.CloseIdleConnections()
		key := fmt.Sprintf("bench-%d", time.Now().UnixNano())
		timed := &timedBucket{Bucket: bucket.NewRedis(rdb, huge)}
		tr := transport.New(base, transport.WithBucket(timed),
			transport.WithKey(func(*http.Request) string { return key }))
		onRedis(b, rdb, func() { benchParallel(b, g, roundTrip(tr, url)) })
		// The one Redis round trip each request makes, timed in this run.
		b.ReportMetric(float64(median(timed.lat).Nanoseconds()), "reserve-p50-ns")
	})
	b.Run("redis-leased", func(b *testing.B) {
		// WithLeasing: one script call per 100 requests.
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: 2 * maxGoroutines})
		defer rdb.Close()
		base := newBase()
		defer base.CloseIdleConnections()
		key := fmt.Sprintf("bench-%d", time.Now().UnixNano())
		bk := bucket.NewRedis(rdb, huge, bucket.WithLeasing(100, 100*time.Millisecond))
		defer bk.Close()
		tr := transport.New(base, transport.WithBucket(bk),
			transport.WithKey(func(*http.Request) string { return key }))
		onRedis(b, rdb, func() { benchParallel(b, g, roundTrip(tr, url)) })
	})
	b.Run("bare+ping", func(b *testing.B) {
		// The target for "redis": a bare round trip after one Redis round
		// trip (PING) of its own, in the same loop.
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: 2 * maxGoroutines})
		defer rdb.Close()
		base := newBase()
		defer base.CloseIdleConnections()
		rt := roundTrip(base, url)
		onRedis(b, rdb, func() {
			benchParallel(b, g, func() error {
				if err := rdb.Ping(context.Background()).Err(); err != nil {
					return err
				}
				return rt()
			})
		})
	})
	b.Run("redis-reserve", func(b *testing.B) {
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: 2 * maxGoroutines})
		defer rdb.Close()
		bk := bucket.NewRedis(rdb, huge)
		key := fmt.Sprintf("bench-%d", time.Now().UnixNano())
		onRedis(b, rdb, func() {
			benchParallel(b, g, func() error {
				_, err := bk.Reserve(context.Background(), key, bucket.N(1), bucket.Unlimited)
				return err
			})
		})
	})
	b.Run("redis-ping", func(b *testing.B) {
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: 2 * maxGoroutines})
		defer rdb.Close()
		onRedis(b, rdb, func() {
			benchParallel(b, g, func() error { return rdb.Ping(context.Background()).Err() })
		})
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

// benchParallel runs op b.N times in total from g goroutines and reports
// the median latency of one op.
func benchParallel(b *testing.B, g int, op func() error) {
	if err := op(); err != nil { // warm up: connections, scripts
		b.Fatal(err)
	}
	var (
		next atomic.Int64
		mu   sync.Mutex
		all  = make([]time.Duration, 0, b.N)
		wg   sync.WaitGroup
	)
	b.ReportAllocs()
	cpu := processCPU(b)
	b.ResetTimer()
	for range g {
		wg.Go(func() {
			lat := make([]time.Duration, 0, b.N/g+1)
			for next.Add(1) <= int64(b.N) {
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
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64((processCPU(b)-cpu).Microseconds())/float64(b.N), "cpu-us/op")
	if len(all) > 0 {
		b.ReportMetric(float64(median(all).Nanoseconds()), "p50-ns")
	}
}

// processCPU is the CPU time this process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// onRedis runs run, a benchParallel of b, and reports the CPU that rdb's
// server spent per op, and its script calls per op if it ran any. The
// server is this package's own (redistest): nothing else calls it while a
// benchmark runs.
func onRedis(b *testing.B, rdb *redis.Client, run func()) {
	cpu0 := serverCPU(b, rdb)
	calls0, _ := redistest.ScriptStats(b, rdb)
	run()
	calls1, _ := redistest.ScriptStats(b, rdb)
	cpu1 := serverCPU(b, rdb)
	// The warm-up op and the INFO calls are counted too: a few in b.N.
	b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "redis-cpu-us/op")
	if calls1 > calls0 {
		b.ReportMetric(float64(calls1-calls0)/float64(b.N), "scripts/op")
	}
}

// serverCPU is the CPU time rdb's server has used, user and system, from
// INFO cpu.
func serverCPU(b *testing.B, rdb *redis.Client) time.Duration {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum time.Duration
	for line := range strings.Lines(info) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k != "used_cpu_user" && k != "used_cpu_sys" {
			continue
		}
		sec, err := strconv.ParseFloat(v, 64)
		if err != nil {
			b.Fatalf("INFO cpu %q: %v", line, err)
		}
		sum += time.Duration(sec * float64(time.Second))
	}
	return sum
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[len(d)/2]
}

// timedBucket records how long each Reserve takes.
type timedBucket struct {
	bucket.Bucket
	mu  sync.Mutex
	lat []time.Duration
}

func (t *timedBucket) Reserve(ctx context.Context, key string, cost bucket.Cost, maxWait time.Duration) (bucket.Reservation, error) {
	start := time.Now()
	r, err := t.Bucket.Reserve(ctx, key, cost, maxWait)
	d := time.Since(start)
	t.mu.Lock()
	t.lat = append(t.lat, d)
	t.mu.Unlock()
	return r, err
}
