// Command scriptcost makes n decisions on one key that always admits, from
// g goroutines, against the Redis at addr, with one of:
//
//	sluice     sluice's Redis Reserve, each its own script call (WithoutCoalescing)
//	coalesced  sluice's Redis Reserve, coalesced (the default)
//	sluice2    Reserve of two dimensions, each its own script call
//	redis_rate go-redis/redis_rate AllowN
//	floor      a script that makes only the Redis calls of sluice's hot path
//	           (TIME, the adaptive state's HMGET, the dimension's HMGET, an
//	           HSET) on a hash with the fields a warm key has, and nothing else
//	return1    a script that returns 1
//
// run.sh runs it against a redis-server under callgrind, which counts the
// server's instructions inside EVALSHA, and prints them per decision
// (docs/performance.md gives the commands).
//
//	scriptcost -addr host:port -mode M -n N [-g G] [-key K]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
)

// floorScript makes the Redis calls that sluice's reserve script makes on
// a warm key of one dimension, and nothing else.
const floorScript = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
redis.call('HMGET', KEYS[1], 'e', 'a', 'd', 'p')
redis.call('HMGET', KEYS[2], 't', 'ts', 'x', 'r', 'b', 'rx', 'p', 'cr', 'crx', 'cb', 'cbx')
redis.call('HSET', KEYS[2], 't', 999999000000, 'ts', now)
return 0
`

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "the Redis server")
	mode := flag.String("mode", "sluice", "sluice, coalesced, sluice2, redis_rate, floor or return1")
	n := flag.Int("n", 1000, "decisions")
	g := flag.Int("g", 1, "goroutines")
	key := flag.String("key", "scriptcost", "the key")
	flag.Parse()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: *addr, PoolSize: max(*g, 10)})
	defer rdb.Close()
	huge := bucket.Limit{Rate: 1e6, Burst: 1e6}
	reserve := func(b *bucket.Redis, cost bucket.Cost) func() error {
		return func() error {
			r, err := b.Reserve(ctx, *key, cost, 0)
			if err == nil && (!r.OK || r.Epoch > 1<<62) {
				err = fmt.Errorf("refused or served by the fallback: %+v", r)
			}
			return err
		}
	}
	var fn func() error
	switch *mode {
	case "sluice":
		fn = reserve(bucket.NewRedis(rdb, huge, bucket.WithoutCoalescing()), bucket.N(1))
	case "coalesced":
		fn = reserve(bucket.NewRedis(rdb, huge), bucket.N(1))
	case "sluice2":
		fn = reserve(bucket.NewRedis(rdb, huge, bucket.WithLimit(bucket.Tokens, huge), bucket.WithoutCoalescing()),
			bucket.Cost{bucket.Requests: 1, bucket.Tokens: 500})
	case "redis_rate":
		lim := redis_rate.NewLimiter(rdb)
		l := redis_rate.Limit{Rate: 1e6, Burst: 1e6, Period: time.Second}
		fn = func() error {
			_, err := lim.AllowN(ctx, *key, l, 1)
			return err
		}
	case "floor":
		s := redis.NewScript(floorScript)
		keys := []string{"sluice:{" + *key + "}", "sluice:{" + *key + "}:requests"}
		// the fields of a warm key (a Reserve's pins, life and expiry)
		far := time.Now().Add(time.Hour).UnixMicro()
		if err := rdb.HSet(ctx, keys[1], "cr", 1e12, "crx", far, "cb", 1e12, "cbx", far, "i", far, "x", far).Err(); err != nil {
			fail(err)
		}
		fn = func() error { return s.Run(ctx, rdb, keys).Err() }
	case "return1":
		s := redis.NewScript(`return 1`)
		keys := []string{*key}
		fn = func() error { return s.Run(ctx, rdb, keys).Err() }
	default:
		fail(fmt.Errorf("unknown mode %q", *mode))
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range *g {
		wg.Go(func() {
			for next.Add(1) <= int64(*n) {
				if err := fn(); err != nil {
					fail(err)
				}
			}
		})
	}
	wg.Wait()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "scriptcost:", err)
	os.Exit(1)
}
