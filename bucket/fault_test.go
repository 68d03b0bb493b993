package bucket_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The fault tests re-execute the test binary as worker processes, like the
// fleet tests; TestMain sends a process with faultWorkerEnv set to
// faultWorker.
const faultWorkerEnv = "SLUICE_BUCKET_FAULT_WORKER"

// faultSpec is what the parent tells each fault worker, as JSON.
type faultSpec struct {
	Addr       string   // a Redis server; or
	Sentinels  []string // the sentinels watching Master
	Master     string
	Prefix     string
	Key        string
	Limit      bucket.Limit
	FailClosed bool
	Goroutines int
	Start      time.Time // all workers begin together, and end when their stdin does
}

// faultCall is one Reserve made by a worker. Times are Unix ns.
type faultCall struct {
	Start       int64
	Latency     int64 // how long Reserve took
	Delay       int64 // the wait it asked for, if OK
	OK          bool
	Err         string
	Unavailable bool  // errors.Is(err, bucket.ErrUnavailable)
	Members     int64 // the fleet size the bucket knew
}

// faultState is a change of a worker's breaker.
type faultState struct {
	At       int64
	From, To string
}

type faultResult struct {
	Calls  []faultCall
	States []faultState
}

// faultWorker saturates spec.Key until its stdin ends: each goroutine
// reserves a request (at most a second ahead), waits for its slot, and goes
// again; it records every call and every change of the bucket's breaker.
func faultWorker() int {
	var spec faultSpec
	if err := json.Unmarshal([]byte(os.Getenv(faultWorkerEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	redis.SetLogger(quietLogger{}) // go-redis logs every failed dial
	var rdb redis.UniversalClient
	if spec.Master != "" {
		rdb = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: spec.Master, SentinelAddrs: spec.Sentinels,
			ContextTimeoutEnabled: true, PoolSize: spec.Goroutines + 2})
	} else {
		rdb = redis.NewClient(&redis.Options{Addr: spec.Addr, ContextTimeoutEnabled: true, PoolSize: spec.Goroutines + 2})
	}
	defer rdb.Close()
	var (
		mu  sync.Mutex
		res faultResult
	)
	opts := []bucket.Option{bucket.WithPrefix(spec.Prefix), bucket.WithRedisBreaker(gobreaker.Settings{
		OnStateChange: func(_ string, from, to gobreaker.State) {
			mu.Lock()
			res.States = append(res.States, faultState{At: time.Now().UnixNano(), From: from.String(), To: to.String()})
			mu.Unlock()
		},
	})}
	if spec.FailClosed {
		opts = append(opts, bucket.WithFailClosed())
	}
	b := bucket.NewRedis(rdb, spec.Limit, opts...)
	ctx, stop := context.WithCancel(context.Background())
	go func() { io.Copy(io.Discard, os.Stdin); stop() }()
	// Connect, load the script and join the fleet before the start.
	if _, err := b.Reserve(ctx, spec.Key+":warmup", bucket.N(1), 0); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	time.Sleep(time.Until(spec.Start))
	var wg sync.WaitGroup
	for range spec.Goroutines {
		wg.Go(func() {
			var calls []faultCall
			for ctx.Err() == nil {
				start := time.Now()
				r, err := b.Reserve(context.WithoutCancel(ctx), spec.Key, bucket.N(1), time.Second)
				c := faultCall{Start: start.UnixNano(), Latency: int64(time.Since(start)), OK: r.OK, Members: bucket.Members(b)}
				switch {
				case err != nil:
					c.Err, c.Unavailable = err.Error(), errors.Is(err, bucket.ErrUnavailable)
					time.Sleep(10 * time.Millisecond)
				case r.OK:
					c.Delay = int64(r.Delay)
					time.Sleep(r.Delay)
				default:
					time.Sleep(r.RetryAfter)
				}
				calls = append(calls, c)
			}
			mu.Lock()
			res.Calls = append(res.Calls, calls...)
			mu.Unlock()
		})
	}
	wg.Wait()
	out, err := json.Marshal(res)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	os.Stdout.Write(out)
	return 0
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// startFaultFleet starts procs fault workers on spec and returns a function
// that stops them and returns their results.
func startFaultFleet(t *testing.T, procs int, spec faultSpec) (stop func() []faultResult) {
	t.Helper()
	raw, err := json.Marshal(spec)
	require.NoError(t, err)
	results := make([]faultResult, procs)
	errs := make([]error, procs)
	stdins := make([]io.Closer, procs)
	var wg sync.WaitGroup
	for i := range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), faultWorkerEnv+"="+string(raw))
		cmd.Stderr = os.Stderr
		var out bytes.Buffer
		cmd.Stdout = &out
		stdins[i], err = cmd.StdinPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		wg.Go(func() {
			if errs[i] = cmd.Wait(); errs[i] == nil {
				errs[i] = json.Unmarshal(out.Bytes(), &results[i])
			}
		})
	}
	return func() []faultResult {
		for _, in := range stdins {
			in.Close()
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "worker %d", i)
		}
		return results
	}
}

// sleepUntil sleeps until t.
func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }

// p99 returns the 99th percentile of d (0 if empty).
func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[int(math.Ceil(0.99*float64(len(d))))-1]
}

// backOnRedis returns when a worker's breaker closed again at or after t,
// or zero.
func backOnRedis(states []faultState, t time.Time) time.Time {
	for _, s := range states {
		if s.To == gobreaker.StateClosed.String() && s.At >= t.UnixNano() {
			return time.Unix(0, s.At)
		}
	}
	return time.Time{}
}

// TestFaultRedisDown is the acceptance test of the failure policy: two
// fleets of worker processes saturate their keys for 10 s while the Redis
// they share is killed at 3 s and started again, empty, at 6 s.
//
// The fleet that fails open (3 processes) loses no call; while Redis is
// down each process admits no more than its share, Burst/3 + Rate/3 per
// second; every process is back on Redis within 2 s of the restart; and
// the outage adds no more than the Redis timeout to the p99 latency of
// Reserve. The fleet that fails closed (2 processes) gets errors, all
// *UnavailableError, during the outage only.
func TestFaultRedisDown(t *testing.T) {
	srv := redistest.Own(t)
	const (
		openProcs, closedProcs = 3, 2
		timeout                = 250 * time.Millisecond // the default Redis timeout
		breakerPeriod          = 500 * time.Millisecond // the default breaker timeout
	)
	openLim := bucket.Limit{Rate: 900, Burst: 90}
	start := time.Now().Add(1500 * time.Millisecond) // room for the processes to start
	stopOpen := startFaultFleet(t, openProcs, faultSpec{Addr: srv.Addr, Prefix: "open", Key: "fault",
		Limit: openLim, Goroutines: 4, Start: start})
	stopClosed := startFaultFleet(t, closedProcs, faultSpec{Addr: srv.Addr, Prefix: "closed", Key: "fault",
		Limit: bucket.Limit{Rate: 50, Burst: 10}, FailClosed: true, Goroutines: 2, Start: start})

	sleepUntil(start.Add(3 * time.Second))
	stopAt := time.Now()
	srv.Stop()
	downAt := time.Now() // nothing is served from here until restartBegin
	sleepUntil(start.Add(6 * time.Second))
	restartBegin := time.Now()
	require.NoError(t, srv.Restart())
	restartAt := time.Now() // answering PING
	sleepUntil(restartAt.Add(3 * time.Second))
	open, closed := stopOpen(), stopClosed()
	outage := restartAt.Sub(stopAt)
	t.Logf("Redis killed at %.3f s, started again at %.3f s, answering at %.3f s (down %v); the fleets ran %.3f s",
		stopAt.Sub(start).Seconds(), restartBegin.Sub(start).Seconds(), restartAt.Sub(start).Seconds(),
		outage.Round(time.Millisecond), time.Since(start).Seconds())

	t.Run("fail open", func(t *testing.T) {
		var (
			calls, failed, admittedDown, admitted int
			bound, worstRecovery                  float64
			before, during                        []time.Duration
			first, last                           time.Time // the first call, the last slot
		)
		for i, res := range open {
			// From the restart's beginning: Redis may answer a worker's
			// probe before it answers the test's PING (21 ms before it, on
			// a loaded machine, in one run).
			back := backOnRedis(res.States, restartBegin)
			require.False(t, back.IsZero(), "worker %d never went back to Redis: %v", i, res.States)
			recovery := max(back.Sub(restartAt), 0)
			worstRecovery = max(worstRecovery, recovery.Seconds())
			assert.Less(t, recovery, 2*time.Second, "worker %d back on Redis", i)

			// Admissions reserved while Redis was down, from the share
			// bucket: at most its burst plus its rate over the time from
			// the kill to the last slot it gave.
			var n int
			var members int64
			var lastSlot time.Time
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
				if c.OK {
					admitted++
					if slot := st.Add(time.Duration(c.Latency + c.Delay)); slot.After(last) {
						last = slot
					}
				}
				switch {
				case st.Before(start.Add(500 * time.Millisecond)): // warming up
				case st.Before(stopAt):
					before = append(before, time.Duration(c.Latency))
				case st.Before(back):
					during = append(during, time.Duration(c.Latency))
					if st.Before(restartAt) {
						members = c.Members
					}
					if c.OK {
						n++
						if slot := st.Add(time.Duration(c.Latency + c.Delay)); slot.After(lastSlot) {
							lastSlot = slot
						}
					}
				}
			}
			assert.Equal(t, int64(openProcs), members, "worker %d knew the fleet's size", i)
			share := float64(max(members, 1))
			b := openLim.Burst/share + openLim.Rate/share*lastSlot.Sub(stopAt).Seconds()
			t.Logf("fail open, worker %d: %d admitted while Redis was down, share bound %.1f; back on Redis %v after the restart",
				i, n, b, recovery.Round(time.Millisecond))
			assert.LessOrEqual(t, float64(n), b+1, "worker %d within its share", i)
			admittedDown += n
			bound += b
		}
		added := p99(during) - p99(before)
		t.Logf("fail open: %d calls, %d failed; while down the fleet admitted %d, share bound %.1f (%.1f%%; Burst + Rate·T over the outage: %.1f); "+
			"back on Redis at most %.3f s after the restart; Reserve p99 %v before, %v during (added %v, Redis timeout %v), max %v during",
			calls, failed, admittedDown, bound, 100*float64(admittedDown)/bound, openLim.Burst+openLim.Rate*outage.Seconds(),
			worstRecovery, p99(before), p99(during), added, timeout, slices.Max(during))
		// Over the whole run, the fleet is admitted Burst + Rate·T, plus
		// the share buckets' bursts (Burst in all, as each starts full),
		// plus the burst of the Redis bucket, which lost its state, plus
		// what the members that are still on their share take while the
		// others are back on Redis (at most one breaker period).
		normal := openLim.Burst + openLim.Rate*last.Sub(first).Seconds()
		over := float64(admitted) - normal
		t.Logf("fail open, the whole run: admitted %d, Burst + Rate·T %.1f: overshoot %.0f (%.2f bursts, %.2f s of rate)",
			admitted, normal, over, over/openLim.Burst, over/openLim.Rate)
		assert.LessOrEqual(t, over, 2*openLim.Burst+openLim.Rate*breakerPeriod.Seconds())
		assert.Zero(t, failed)
		assert.LessOrEqual(t, added, timeout)
		assert.LessOrEqual(t, slices.Max(during), timeout+breakerPeriod/2, "no call pays much more than one timeout")
	})

	t.Run("fail closed", func(t *testing.T) {
		var calls, failed, admittedDown int
		var firstErr, lastErr time.Time
		var worstRecovery time.Duration
		for i, res := range closed {
			var firstOK time.Time // after the restart
			for _, c := range res.Calls {
				calls++
				st := time.Unix(0, c.Start)
				if c.Err == "" {
					// restartAt is when the test's PING was answered: on
					// a loaded machine the workers' calls may be served
					// before that, once the server has started.
					if c.OK && st.After(downAt) && st.Before(restartBegin) {
						admittedDown++
					}
					if st.After(restartAt) && firstOK.IsZero() {
						firstOK = st
					}
					continue
				}
				failed++
				assert.True(t, c.Unavailable, "worker %d: %s", i, c.Err)
				if firstErr.IsZero() || st.Before(firstErr) {
					firstErr = st
				}
				if st.After(lastErr) {
					lastErr = st
				}
			}
			require.False(t, firstOK.IsZero(), "worker %d never recovered", i)
			worstRecovery = max(worstRecovery, firstOK.Sub(restartAt))
		}
		t.Logf("fail closed: %d calls, %d failed with ErrUnavailable, from %.3f s to %.3f s (Redis down from %.3f s to %.3f s); "+
			"%d admitted while down; first success at most %v after the restart",
			calls, failed, firstErr.Sub(start).Seconds(), lastErr.Sub(start).Seconds(),
			stopAt.Sub(start).Seconds(), restartAt.Sub(start).Seconds(), admittedDown, worstRecovery.Round(time.Millisecond))
		assert.Positive(t, failed)
		assert.Zero(t, admittedDown)
		assert.False(t, firstErr.Before(stopAt.Add(-timeout)), "no error before the kill (but calls in flight)")
		assert.True(t, lastErr.Before(restartAt.Add(2*time.Second)), "no error 2 s after the restart")
		assert.Less(t, worstRecovery, 2*time.Second)
	})
}
