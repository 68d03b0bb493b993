package bucket_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestRedisCluster: on a real 3-node Redis Cluster, every backend takes a
// two-dimension cost in one script (all of a key's hashes share a slot, so
// no CROSSSLOT), for keys spread over the nodes and for keys holding braces
// or too long to keep, and the token bucket keeps its bound under
// concurrency.
func TestRedisCluster(t *testing.T) {
	addrs := redistest.Cluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer rdb.Close()
	ctx := context.Background()
	opts := bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 1000, Burst: 1000})
	cost := bucket.Cost{bucket.Requests: 1, bucket.Tokens: 100}

	for name, b := range map[string]bucket.Bucket{
		"token bucket": bucket.NewRedis(rdb, bucket.PerSecond(5), opts),
		"fixed window": bucket.NewFixedWindow(rdb, bucket.PerSecond(5), opts),
		"sliding log":  bucket.NewSlidingLog(rdb, bucket.PerSecond(5), opts),
	} {
		t.Run(name, func(t *testing.T) {
			for i := range 30 { // 30 keys land on all three nodes
				key := fmt.Sprintf("%s-%d", name, i)
				r, err := b.Reserve(ctx, key, cost, 0)
				require.NoError(t, err)
				assert.True(t, r.OK)
				require.NoError(t, b.Adjust(ctx, key, cost.Neg()))
			}
			// Braces in a key cannot choose the slot, and keys that differ
			// only by their braces or escapes, or past what is kept of a
			// long key, have buckets of their own: each gives its burst.
			huge := strings.Repeat("k", 600)
			for _, key := range []string{"}", "{", "{}", "}x", "{a}", "a}b{c", "a}", "a%7D", huge, huge + "}"} {
				key += "-" + name // the key's own braces first
				for range 5 {
					r, err := b.Reserve(ctx, key, cost, 0)
					require.NoError(t, err, "%q", key)
					assert.True(t, r.OK, "%q", key)
				}
				require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.RateLimited}))
			}
			var longest atomic.Int64
			require.NoError(t, rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
				keys, err := node.Keys(ctx, "*"+name+"*").Result()
				for _, k := range keys {
					if n := int64(len(k)); n > longest.Load() {
						longest.Store(n) // one node may lose to another: fine for a bound
					}
				}
				return err
			}))
			assert.Less(t, longest.Load(), int64(128), "long keys are hashed")
		})
	}

	lim := bucket.Limit{Rate: 200, Burst: 20}
	b := bucket.NewRedis(rdb, lim)
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(time.Second)
	for range 16 {
		wg.Go(func() {
			for time.Now().Before(end) {
				r, err := b.Reserve(ctx, "cluster-hot", bucket.N(1), 0)
				if !assert.NoError(t, err) {
					return
				}
				if r.OK {
					admitted.Add(1)
				} else {
					refused.Add(1)
				}
			}
		})
	}
	wg.Wait()
	span := time.Since(start)
	if refused.Load() >= 4*admitted.Load() {
		assertConserved(t, lim, admitted.Load(), span, "cluster")
	} else {
		// The fleet did not keep the key saturated (a loaded machine: two
		// hogs and another package's tests made 16 goroutines offer too
		// few calls): only the bound holds.
		t.Logf("cluster: admitted %d, refused %d: not saturated, the lower bound does not apply", admitted.Load(), refused.Load())
		assert.LessOrEqual(t, float64(admitted.Load()), lim.Burst+lim.Rate*span.Seconds()+1)
	}

	// An InFlight's keys share a slot, and its waiters are woken through a
	// channel whose node is not the key's: Redis Cluster carries the
	// message across. Six keys land on all three nodes.
	sem := bucket.NewInFlight(rdb, 2, bucket.WithLease(time.Second))
	var most atomic.Int64
	for i := range 6 {
		key := fmt.Sprintf("cluster-inflight-%d", i)
		var in atomic.Int64
		for range 6 {
			wg.Go(func() {
				for range 10 {
					release, err := sem.Acquire(ctx, key)
					if !assert.NoError(t, err) {
						return
					}
					now := in.Add(1)
					for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
					}
					time.Sleep(time.Millisecond)
					in.Add(-1)
					release()
				}
			})
		}
	}
	start = time.Now()
	wg.Wait()
	t.Logf("cluster in-flight: 6 keys x 60 calls of 1 ms on 2 slots in %v, at most %d in flight on a key", time.Since(start).Round(time.Millisecond), most.Load())
	assert.Equal(t, int64(2), most.Load())
	assert.Less(t, time.Since(start), 5*time.Second, "waiters are woken, not left to their renewals")
}
