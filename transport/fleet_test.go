package transport_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The fleet: processes × goroutines make calls through sluice against a
// server that allows rate requests per second with a burst of rate.
const (
	fleetProcs      = 4
	fleetGoroutines = 8
	fleetCalls      = 300
	fleetRate       = 20
)

// Environment of a fleet worker process.
const (
	fleetWorkerEnv = "SLUICE_TRANSPORT_FLEET_WORKER" // the worker's index
	fleetRedisEnv  = "SLUICE_FLEET_REDIS"
	fleetURLEnv    = "SLUICE_FLEET_URL"
	fleetKeyEnv    = "SLUICE_FLEET_KEY"
	fleetStartEnv  = "SLUICE_FLEET_START" // Unix nanoseconds at which to begin
	fleetCallsEnv  = "SLUICE_FLEET_CALLS"
)

// fleetResult is what a worker prints on stdout.
type fleetResult struct {
	OK, NotOK, Failed int
	Throttled         int64 // 429s the worker's attempts got
	Last              int64 // Unix nanoseconds of its last completion
	Err               string
}

// fleetWorker runs one worker process of TestFleet and returns its exit code.
func fleetWorker() int {
	calls, _ := strconv.Atoi(os.Getenv(fleetCallsEnv))
	startNs, _ := strconv.ParseInt(os.Getenv(fleetStartEnv), 10, 64)
	url, key := os.Getenv(fleetURLEnv), os.Getenv(fleetKeyEnv)
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(fleetRedisEnv), PoolSize: 2 * fleetGoroutines})
	defer rdb.Close()
	base := &http.Transport{MaxIdleConnsPerHost: 2 * fleetGoroutines}
	defer base.CloseIdleConnections()
	var throttled atomic.Int64
	counted := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := base.RoundTrip(r)
		if err == nil && resp.StatusCode == http.StatusTooManyRequests {
			throttled.Add(1)
		}
		return resp, err
	})
	tr := transport.New(counted,
		transport.WithBucket(bucket.NewRedis(rdb, bucket.PerSecond(fleetRate))),
		transport.WithKey(func(*http.Request) string { return key }))
	client := &http.Client{Transport: tr, Timeout: time.Minute}

	time.Sleep(time.Until(time.Unix(0, startNs)))
	var (
		mu   sync.Mutex
		res  fleetResult
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range fleetGoroutines {
		wg.Go(func() {
			for next.Add(1) <= int64(calls) {
				resp, err := client.Get(url)
				now := time.Now().UnixNano()
				mu.Lock()
				switch {
				case err != nil:
					res.Failed++
					if res.Err == "" {
						res.Err = err.Error()
					}
				case resp.StatusCode == http.StatusOK:
					res.OK++
				default:
					res.NotOK++
				}
				res.Last = max(res.Last, now)
				mu.Unlock()
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		})
	}
	wg.Wait()
	res.Throttled = throttled.Load()
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

// TestFleet is the acceptance test of the shared quota: fleetProcs processes
// of fleetGoroutines goroutines each make fleetCalls calls in all, through
// one Redis bucket at the server's own limit. All succeed, the server
// rejects almost none, and the makespan is within 5% of the ideal. The same
// workload through go-retryablehttp's default client is measured for
// comparison in the compat module (TestFleetRetryablehttp).
func TestFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("the fleet test takes about 30s")
	}
	addr := redistest.Addr(t)
	ideal := time.Duration(float64(fleetCalls-fleetRate) / fleetRate * float64(time.Second)) // burst, then the rate

	srv := llmtest.NewServer(llmtest.Config{Requests: llmtest.TokenBucket(fleetRate, time.Second, fleetRate), RetryAfterMs: true})
	defer srv.Close()
	start := time.Now().Add(1500 * time.Millisecond)
	key := fmt.Sprintf("transport-fleet-%d", time.Now().UnixNano())
	share := fleetCalls / fleetProcs
	type proc struct {
		cmd            *exec.Cmd
		stdout, stderr bytes.Buffer
	}
	procs := make([]*proc, fleetProcs)
	for i := range procs {
		p := &proc{cmd: exec.Command(os.Args[0], "-test.run=^$")}
		calls := share
		if i == 0 {
			calls += fleetCalls - share*fleetProcs
		}
		p.cmd.Env = append(os.Environ(),
			fleetWorkerEnv+"="+strconv.Itoa(i+1),
			fleetRedisEnv+"="+addr,
			fleetURLEnv+"="+srv.URL+"/ping",
			fleetKeyEnv+"="+key,
			fleetStartEnv+"="+strconv.FormatInt(start.UnixNano(), 10),
			fleetCallsEnv+"="+strconv.Itoa(calls),
		)
		p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
		require.NoError(t, p.cmd.Start())
		procs[i] = p
	}
	var total fleetResult
	for i, p := range procs {
		err := p.cmd.Wait()
		require.NoError(t, err, "worker %d: %s", i+1, p.stderr.String())
		var r fleetResult
		require.NoError(t, json.Unmarshal(p.stdout.Bytes(), &r), "worker %d output %q", i+1, p.stdout.String())
		assert.Empty(t, r.Err, "worker %d", i+1)
		total.OK += r.OK
		total.NotOK += r.NotOK
		total.Failed += r.Failed
		total.Throttled += r.Throttled
		total.Last = max(total.Last, r.Last)
	}
	st := srv.Stats()
	makespan := time.Unix(0, total.Last).Sub(start)
	t.Logf("sluice (%d processes x %d goroutines, Redis bucket %d/s): %d/%d calls succeeded (%d other status, %d errors); server saw %d requests, %d rejected with 429; makespan %.2fs (ideal %.2fs, %+.1f%%)",
		fleetProcs, fleetGoroutines, fleetRate, total.OK, fleetCalls, total.NotOK, total.Failed,
		st.Accepted+st.Rejected, st.Rejected, makespan.Seconds(), ideal.Seconds(), 100*(makespan.Seconds()/ideal.Seconds()-1))
	assert.Equal(t, fleetCalls, total.OK, "every call succeeds")
	assert.LessOrEqual(t, st.Rejected, int64(3), "the server rejects at most 3")
	assert.InDelta(t, ideal.Seconds(), makespan.Seconds(), 0.05*ideal.Seconds(), "makespan within 5%% of the ideal")
}
