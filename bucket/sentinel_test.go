package bucket_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestSentinelFailover: a fleet of 2 worker processes, each with a go-redis
// failover client, saturates a key while the sentinel fails its master over
// to the replica (SENTINEL FAILOVER), then, the new master killed, back to
// the first. No call fails, the fleet stays within its bound, and it ends
// on the last master, which holds the key.
func TestSentinelFailover(t *testing.T) {
	s := redistest.StartSentinel(t)
	ctx := t.Context()
	lim := bucket.Limit{Rate: 300, Burst: 30}
	start := time.Now().Add(time.Second)
	stop := startFaultFleet(t, 2, faultSpec{Sentinels: s.Addrs, Master: s.MasterName, Prefix: "sentinel",
		Key: "failover", Limit: lim, Goroutines: 3, Start: start})

	switchTo := func(srv *redistest.Server) time.Time {
		require.Eventually(t, func() bool {
			addr, err := s.MasterAddr(ctx)
			return err == nil && addr == srv.Addr
		}, 10*time.Second, 10*time.Millisecond, "%s becomes the master", srv.Addr)
		return time.Now()
	}
	sleepUntil(start.Add(500 * time.Millisecond))
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addrs[0]})
	defer sc.Close()
	failoverAt := time.Now()
	require.NoError(t, sc.Failover(ctx, s.MasterName).Err())
	switchedAt := switchTo(s.Replica)
	sleepUntil(switchedAt.Add(500 * time.Millisecond))
	killedAt := time.Now()
	s.Replica.Stop()
	backAt := switchTo(s.Master)
	sleepUntil(backAt.Add(1500 * time.Millisecond))
	results := stop()

	var calls, failed, admitted, trips int
	var first, last time.Time
	var slowest, recovery time.Duration
	for i, res := range results {
		for _, c := range res.Calls {
			calls++
			if c.Err != "" {
				failed++
				t.Errorf("worker %d: call failed: %s", i, c.Err)
			}
			st := time.Unix(0, c.Start)
			if first.IsZero() || st.Before(first) {
				first = st
			}
			slowest = max(slowest, time.Duration(c.Latency))
			if c.OK {
				admitted++
				if slot := st.Add(time.Duration(c.Latency + c.Delay)); slot.After(last) {
					last = slot
				}
			}
		}
		for _, st := range res.States {
			if st.From == gobreaker.StateClosed.String() {
				trips++
			}
		}
		if n := len(res.States); n > 0 {
			assert.Equal(t, gobreaker.StateClosed.String(), res.States[n-1].To, "worker %d ends on Redis", i)
			recovery = max(recovery, time.Unix(0, res.States[n-1].At).Sub(backAt))
		}
	}
	normal := lim.Burst + lim.Rate*last.Sub(first).Seconds()
	t.Logf("sentinel: new master named %v after SENTINEL FAILOVER, %v after the kill of the next one; "+
		"%d calls, %d failed, slowest Reserve %v; breaker trips %d, back on Redis at most %v after the sentinel named the master; "+
		"admitted %d, Burst + Rate·T %.1f: overshoot %.0f (%.2f bursts)",
		switchedAt.Sub(failoverAt).Round(time.Millisecond), backAt.Sub(killedAt).Round(time.Millisecond),
		calls, failed, slowest.Round(time.Millisecond), trips, recovery.Round(time.Millisecond),
		admitted, normal, float64(admitted)-normal, (float64(admitted)-normal)/lim.Burst)
	assert.Zero(t, failed)
	assert.LessOrEqual(t, float64(admitted), normal+2*lim.Burst+lim.Rate*(500*time.Millisecond).Seconds())

	rdb := redis.NewClient(&redis.Options{Addr: s.Master.Addr})
	defer rdb.Close()
	assert.Equal(t, int64(1), rdb.Exists(ctx, "sentinel:{failover}:requests").Val(), "the new master holds the bucket")
	role, err := rdb.Do(ctx, "ROLE").Slice()
	require.NoError(t, err)
	assert.Equal(t, "master", role[0])
}
