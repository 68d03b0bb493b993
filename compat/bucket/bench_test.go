package bucket_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The benchmarks compare each backend with its peer in one run, at 1, 8 and
// 64 goroutines, on one hot key that always admits (the write path):
//
//	go test -run '^$' -bench . -benchtime 2s ./compat/bucket
//
// Redis Reserve against go-redis/redis_rate AllowN and a trivial EVALSHA
// (the round-trip floor); Local Reserve against x/time/rate ReserveN. They
// live here, not in sluice's bucket package, so that each ratio comes from
// one run and the library's module needs neither peer.

var goroutineCounts = []int{1, 8, 64}

// parallel runs fn b.N times in total from g goroutines and reports calls/s.
func parallel(b *testing.B, g int, fn func()) {
	b.ReportAllocs()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range g {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				fn()
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
}

func benchClient(b *testing.B) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: 64})
	b.Cleanup(func() { rdb.Close() })
	return rdb
}

func BenchmarkRedis(b *testing.B) {
	ctx := context.Background()
	rdb := benchClient(b)
	huge := bucket.Limit{Rate: 1e6, Burst: 1e6}
	trivial := redis.NewScript(`return 1`)
	for _, g := range goroutineCounts {
		gs := "g=" + strconv.Itoa(g)
		b.Run("sluice_Reserve/"+gs, func(b *testing.B) {
			bk := bucket.NewRedis(rdb, huge)
			cost := bucket.N(1)
			parallel(b, g, func() {
				if _, err := bk.Reserve(ctx, "bench", cost, 0); err != nil {
					b.Error(err)
				}
			})
		})
		b.Run("sluice_Reserve_2dims/"+gs, func(b *testing.B) {
			bk := bucket.NewRedis(rdb, huge, bucket.WithLimit(bucket.Tokens, huge))
			cost := bucket.Cost{bucket.Requests: 1, bucket.Tokens: 500}
			parallel(b, g, func() {
				if _, err := bk.Reserve(ctx, "bench2", cost, 0); err != nil {
					b.Error(err)
				}
			})
		})
		b.Run("redis_rate_AllowN/"+gs, func(b *testing.B) {
			lim := redis_rate.NewLimiter(rdb)
			l := redis_rate.Limit{Rate: 1e6, Burst: 1e6, Period: time.Second}
			parallel(b, g, func() {
				if _, err := lim.AllowN(ctx, "bench", l, 1); err != nil {
					b.Error(err)
				}
			})
		})
		b.Run("EVALSHA_return_1/"+gs, func(b *testing.B) {
			keys := []string{"bench-trivial"}
			parallel(b, g, func() {
				if err := trivial.Run(ctx, rdb, keys).Err(); err != nil {
					b.Error(err)
				}
			})
		})
	}
}

func BenchmarkLocal(b *testing.B) {
	ctx := context.Background()
	for _, g := range goroutineCounts {
		gs := "g=" + strconv.Itoa(g)
		b.Run("sluice_Reserve/"+gs, func(b *testing.B) {
			bk := bucket.NewLocal(bucket.Limit{Rate: 1e6, Burst: 1e6})
			cost := bucket.N(1)
			parallel(b, g, func() {
				if _, err := bk.Reserve(ctx, "bench", cost, 0); err != nil {
					b.Error(err)
				}
			})
		})
		b.Run("x_time_rate_ReserveN/"+gs, func(b *testing.B) {
			lim := rate.NewLimiter(1e6, 1e6)
			parallel(b, g, func() {
				if !lim.ReserveN(time.Now(), 1).OK() {
					b.Error("not OK")
				}
			})
		})
	}
}
