package bucket_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The fleet tests re-execute the test binary as worker processes; TestMain
// sends a process with fleetWorkerEnv set to fleetWorker instead of the tests.
const fleetWorkerEnv = "SLUICE_BUCKET_FLEET_WORKER"

// fleetSpec is what the parent tells each worker process, as JSON.
type fleetSpec struct {
	Addr       string
	Key        string
	Requests   bucket.Limit
	Tokens     *bucket.Limit // second dimension, charged with TokenCost
	TokenCost  float64
	Goroutines int
	Start      time.Time // all workers begin together
	Duration   time.Duration
}

// fleetResult is what a worker reports on stdout, as JSON.
type fleetResult struct {
	Admitted   int
	Calls      int
	FirstSent  time.Time
	LastReturn time.Time
}

func fleetWorker() int {
	var spec fleetSpec
	if err := json.Unmarshal([]byte(os.Getenv(fleetWorkerEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: spec.Addr, PoolSize: spec.Goroutines})
	defer rdb.Close()
	cost := bucket.N(1)
	var opts []bucket.Option
	if spec.Tokens != nil {
		opts = append(opts, bucket.WithLimit(bucket.Tokens, *spec.Tokens))
		cost[bucket.Tokens] = spec.TokenCost
	}
	b := bucket.NewRedis(rdb, spec.Requests, opts...)
	ctx := context.Background()
	// Load the script before the start so every worker's first call is a
	// plain EVALSHA.
	if err := bucket.NewRedis(rdb, spec.Requests).Adjust(ctx, spec.Key+":warmup", bucket.N(0.5)); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	time.Sleep(time.Until(spec.Start))
	end := spec.Start.Add(spec.Duration)
	var admitted, calls atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	first := time.Now()
	for range spec.Goroutines {
		wg.Go(func() {
			for time.Now().Before(end) {
				r, err := b.Reserve(ctx, spec.Key, cost, 0)
				if err != nil {
					failed.Store(err)
					return
				}
				calls.Add(1)
				if r.OK {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	out, _ := json.Marshal(fleetResult{Admitted: int(admitted.Load()), Calls: int(calls.Load()), FirstSent: first, LastReturn: time.Now()})
	fmt.Println(string(out))
	return 0
}

// runFleet starts procs worker processes on spec and sums their results.
func runFleet(t *testing.T, procs int, spec fleetSpec) (admitted, calls int, span time.Duration) {
	t.Helper()
	spec.Start = time.Now().Add(time.Second) // room for the processes to start
	raw, err := json.Marshal(spec)
	require.NoError(t, err)
	results := make([]fleetResult, procs)
	errs := make([]error, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fleetWorkerEnv+"="+string(raw))
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err == nil {
				err = json.Unmarshal(out, &results[i])
			}
			errs[i] = err
		})
	}
	wg.Wait()
	var first, last time.Time
	for i, r := range results {
		require.NoError(t, errs[i], "worker %d", i)
		admitted += r.Admitted
		calls += r.Calls
		if first.IsZero() || r.FirstSent.Before(first) {
			first = r.FirstSent
		}
		if r.LastReturn.After(last) {
			last = r.LastReturn
		}
	}
	return admitted, calls, last.Sub(first)
}

// TestFleetConservation: 4 processes x 8 goroutines saturate one key on a
// real Redis; what they are admitted stays within Burst + Rate*T and reaches
// at least 95% of it. T is measured from the first call sent to the last
// reply received, which contains the server-side span.
func TestFleetConservation(t *testing.T) {
	addr := redistest.Addr(t)
	const procs, goroutines = 4, 8
	dur := 3 * time.Second

	t.Run("one dimension", func(t *testing.T) {
		lim := bucket.Limit{Rate: 400, Burst: 100}
		admitted, calls, span := runFleet(t, procs, fleetSpec{
			Addr: addr, Key: "conserve1-" + strconv.FormatInt(time.Now().UnixNano(), 36),
			Requests: lim, Goroutines: goroutines, Duration: dur,
		})
		assertConserved(t, lim, int64(admitted), span,
			fmt.Sprintf("%d processes x %d goroutines, %d calls in %v", procs, goroutines, calls, span.Round(time.Millisecond)))
		assert.Greater(t, calls, 2*admitted, "the fleet must saturate the key")
	})

	t.Run("two dimensions", func(t *testing.T) {
		reqs := bucket.Limit{Rate: 400, Burst: 100}
		toks := bucket.Limit{Rate: 4000, Burst: 1000} // 20 tokens a call: 200 calls/s, binding
		const tokenCost = 20
		admitted, calls, span := runFleet(t, procs, fleetSpec{
			Addr: addr, Key: "conserve2-" + strconv.FormatInt(time.Now().UnixNano(), 36),
			Requests: reqs, Tokens: &toks, TokenCost: tokenCost, Goroutines: goroutines, Duration: dur,
		})
		tokBound := toks.Burst + toks.Rate*span.Seconds()
		reqBound := reqs.Burst + reqs.Rate*span.Seconds()
		tokens := float64(admitted * tokenCost)
		t.Logf("%d calls in %v: admitted %d (tokens %.0f of bound %.1f, %.1f%%; requests bound %.1f)",
			calls, span.Round(time.Millisecond), admitted, tokens, tokBound, 100*tokens/tokBound, reqBound)
		assert.LessOrEqual(t, tokens, tokBound+tokenCost)
		assert.GreaterOrEqual(t, tokens, 0.95*tokBound)
		assert.LessOrEqual(t, float64(admitted), reqBound+1)
	})
}
