package transport_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/fleettest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
)

// The adaptive fleet: adaptiveProcs processes of adaptiveGoroutines
// goroutines make adaptiveCalls calls in all against a server whose hidden
// limit is adaptiveHidden requests per second, through a client whose
// ceiling is adaptiveCeiling, twice too high.
const (
	adaptiveProcs      = 4
	adaptiveGoroutines = 8
	adaptiveCalls      = 600
	adaptiveHidden     = 20
	adaptiveCeiling    = 2 * adaptiveHidden

	// adaptiveAttempts is the most attempts per call of the recipe: enough
	// that no call fails for want of retries. sluice has its defaults:
	// refusals are retried through the bucket, apart from MaxAttempts.
	adaptiveAttempts = 20
	// adaptiveCallTimeout bounds one call, retries and waits included.
	adaptiveCallTimeout = 2 * time.Minute
)

// adaptiveWorkerEnv holds, in a worker process of TestAdaptiveFleet (this
// test binary started again), its adaptiveWorkerConfig as JSON.
const adaptiveWorkerEnv = "SLUICE_TRANSPORT_ADAPTIVE_WORKER"

// Modes of a worker of TestAdaptiveFleet.
const (
	// modeSluice sends through transport.New with a Redis bucket at the
	// ceiling that adapts (bucket.Observe).
	modeSluice = "sluice"
	// modeStatic is modeSluice with Observe a no-op: the shared bucket
	// stays at the ceiling; the transport still retries after Retry-After
	// and holds its process back meanwhile.
	modeStatic = "static"
	// modeRecipe shares nothing: each goroutine follows recipe.
	modeRecipe = "recipe"
)

// adaptiveWorkerConfig is what a worker process is told to do.
type adaptiveWorkerConfig struct {
	Mode       string
	Redis      string // address of the Redis server
	Prefix     string // of the bucket's Redis keys
	URL        string
	Calls      int // this process's share of the calls
	Goroutines int
	Fleet      int // goroutines in the whole fleet: the recipe's share is Ceiling/Fleet
	Ceiling    float64
	Policy     adaptive.Policy // zero: the default
}

// adaptiveResult is what a worker prints on stdout when it is done.
type adaptiveResult struct {
	OK, NotOK, Failed int
	Throttled         int64         // 429s its attempts got
	First             int64         // Unix nanoseconds of its first attempt
	Last              int64         // Unix nanoseconds of its last completion
	Stall             time.Duration // the longest its timers came late (fleettest.WatchStalls)
	Err               string
}

// adaptiveWorker runs one worker process of TestAdaptiveFleet and returns
// its exit code. It prints "ready" once set up, reads the Unix nanoseconds
// at which to begin from stdin, makes its calls, then prints an
// adaptiveResult.
func adaptiveWorker() int {
	var cfg adaptiveWorkerConfig
	if err := json.Unmarshal([]byte(os.Getenv(adaptiveWorkerEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "adaptive worker: config:", err)
		return 2
	}
	base := &http.Transport{MaxIdleConnsPerHost: 2 * cfg.Goroutines}
	defer base.CloseIdleConnections()
	var throttled, first atomic.Int64
	counted := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		first.CompareAndSwap(0, time.Now().UnixNano())
		resp, err := base.RoundTrip(r)
		if err == nil && resp.StatusCode == http.StatusTooManyRequests {
			throttled.Add(1)
		}
		return resp, err
	})

	// call makes one call, retries included; the goroutine's recipe is
	// given in modeRecipe.
	var call func(ctx context.Context, r *recipe) (*http.Response, error)
	switch cfg.Mode {
	case modeSluice, modeStatic:
		rdb := redis.NewClient(&redis.Options{Addr: cfg.Redis, PoolSize: 2 * cfg.Goroutines, MinIdleConns: cfg.Goroutines})
		defer rdb.Close()
		// Failing closed, with time to spare: a fallback to a bucket of the
		// process's own would void the measurement, and must show.
		var b bucket.Bucket = bucket.NewRedis(rdb, bucket.PerSecond(cfg.Ceiling),
			bucket.WithPrefix(cfg.Prefix), bucket.WithPolicy(cfg.Policy),
			bucket.WithFailClosed(), bucket.WithRedisTimeout(5*time.Second))
		// Load the scripts and connect before the start, on a key of its own.
		if _, err := b.Reserve(context.Background(), "warm-up", bucket.N(1), 0); err != nil {
			fmt.Fprintln(os.Stderr, "adaptive worker: redis:", err)
			return 2
		}
		if cfg.Mode == modeStatic {
			b = noObserve{b}
		}
		client := &http.Client{Transport: transport.New(counted,
			transport.WithBucket(b),
			transport.WithKey(func(*http.Request) string { return "adaptive-fleet" }),
			transport.WithRetry(transport.Retry{MaxRetryAfter: 10 * time.Second}))}
		call = func(ctx context.Context, _ *recipe) (*http.Response, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.URL, nil)
			if err != nil {
				return nil, err
			}
			return client.Do(req)
		}
	case modeRecipe:
		client := &http.Client{Transport: counted}
		call = func(ctx context.Context, r *recipe) (*http.Response, error) {
			return r.do(ctx, client, cfg.URL)
		}
	default:
		fmt.Fprintln(os.Stderr, "adaptive worker: unknown mode", cfg.Mode)
		return 2
	}

	start, err := fleettest.Ready()
	if err != nil {
		fmt.Fprintln(os.Stderr, "adaptive worker:", err)
		return 2
	}
	time.Sleep(time.Until(start))
	stalls := fleettest.WatchStalls()

	var (
		mu   sync.Mutex
		res  adaptiveResult
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range cfg.Goroutines {
		r := newRecipe(cfg.Ceiling/float64(cfg.Fleet), start)
		wg.Go(func() {
			for next.Add(1) <= int64(cfg.Calls) {
				ctx, cancel := context.WithTimeout(context.Background(), adaptiveCallTimeout)
				resp, err := call(ctx, r)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				cancel()
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
					if res.Err == "" {
						res.Err = "status " + resp.Status
					}
				}
				res.Last = max(res.Last, now)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.Throttled, res.First, res.Stall = throttled.Load(), first.Load(), stalls()
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

// noObserve is a Bucket that learns nothing from responses.
type noObserve struct{ bucket.Bucket }

func (noObserve) Observe(context.Context, string, adaptive.Feedback) error { return nil }

// recipe is the per-worker throttle people copy today, one per goroutine,
// sharing nothing: a golang.org/x/time/rate limiter (burst 1) that starts
// at the goroutine's share of the ceiling; after three 429s within
// recipeWindow it halves, then cools down for recipeCooldown before it may
// halve again; after every recipeCalm without a 429 (nor an increase) it
// climbs back by recipeIncrease, up to its share. A 429 is retried after
// its Retry-After (whole seconds; 1 s if absent), up to adaptiveAttempts
// attempts, every attempt waiting on the limiter. A recipe is used by one
// goroutine at a time.
type recipe struct {
	lim       *rate.Limiter
	share     float64
	refusals  []time.Time // within recipeWindow
	decreased time.Time   // the last decrease; zero if none
	calm      time.Time   // the last 429 or increase
}

const (
	recipeThreshold = 3
	recipeWindow    = 5 * time.Second
	recipeCooldown  = 30 * time.Second
	recipeCalm      = 5 * time.Second
	recipeIncrease  = 1.1
)

func newRecipe(share float64, start time.Time) *recipe {
	return &recipe{lim: rate.NewLimiter(rate.Limit(share), 1), share: share, calm: start}
}

// do makes one call to url, retries included.
func (r *recipe) do(ctx context.Context, client *http.Client, url string) (*http.Response, error) {
	for n := 1; ; n++ {
		now := time.Now()
		if now.Sub(r.calm) >= recipeCalm {
			r.lim.SetLimitAt(now, min(rate.Limit(r.share), r.lim.Limit()*recipeIncrease))
			r.calm = now
		}
		if err := r.lim.Wait(ctx); err != nil {
			return nil, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || n == adaptiveAttempts {
			return resp, err
		}
		now = time.Now()
		r.refused(now)
		wait := time.Second
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
			wait = time.Duration(s) * time.Second
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// refused counts a 429 received at now, halving the rate if it is the
// threshold's within the window and the cooldown is over.
func (r *recipe) refused(now time.Time) {
	r.calm = now
	kept := r.refusals[:0]
	for _, t := range r.refusals {
		if now.Sub(t) < recipeWindow {
			kept = append(kept, t)
		}
	}
	r.refusals = append(kept, now)
	if len(r.refusals) >= recipeThreshold && (r.decreased.IsZero() || now.Sub(r.decreased) >= recipeCooldown) {
		r.lim.SetLimitAt(now, r.lim.Limit()/2)
		r.decreased = now
		r.refusals = r.refusals[:0]
	}
}

// adaptiveScenario is one run of TestAdaptiveFleet.
type adaptiveScenario struct {
	name    string
	limit   llmtest.Limit
	headers llmtest.Headers
	mode    string
	client  string          // what the client is, for the table
	policy  adaptive.Policy // of the sluice bucket; zero: the default
	// Issue 4's targets, reported as met or missed; zero: none.
	target429, targetMakespan float64
	// What the test asserts: the targets, or where they are missed the
	// measured figures with a margin, to catch regressions; zero: not
	// asserted beyond completing.
	max429      float64 // 429s as a fraction of the calls
	maxMakespan float64 // makespan as a multiple of the ideal
}

// adaptiveRun is what one scenario measured.
type adaptiveRun struct {
	ok, notOK, failed int
	throttled         int64 // 429s the workers got
	stats             llmtest.Stats
	makespan          time.Duration
	lag               time.Duration // from the start to the last worker's first attempt
	stall             time.Duration // the longest a timer of a worker or of the server came late
	by429             string        // 429s by second of the run, where there were any
	cuts              string        // the bucket's decreases: when, to what fraction
	errs              []string      // the first error of each worker that had one
	series            []llmtest.Point
}

// adaptiveIdeal is the least makespan the hidden limit allows: its burst
// (adaptiveHidden, for each of the three servers) at once, then
// adaptiveHidden per second.
const adaptiveIdeal = time.Duration(float64(adaptiveCalls-adaptiveHidden) / adaptiveHidden * float64(time.Second))

// TestAdaptiveFleet is the fleet acceptance test of the adaptive bucket
// (issue 4): adaptiveProcs processes of adaptiveGoroutines goroutines each
// make adaptiveCalls GET calls in all through one Redis bucket whose
// ceiling is twice the server's hidden limit, starting cold
// (adaptive.Policy.ColdStart: the ceiling is a guess), the transport
// retrying 429s after their Retry-After. The bucket learns the limit from the 429s (and
// from the quota headers, when the server sends them): against a token
// bucket, a fixed window and a sliding window, every call succeeds. Issue
// 4's targets are that the server answers 429 to at most 5% as many
// requests as there are calls (1% with OpenAI headers), and that the
// makespan, from the common start to the last completion, is at most 1.15
// times adaptiveIdeal; the table says which are met, and the test asserts
// them where they are, and the measured figures with a margin where they
// are not (see the scenarios). The per-worker recipe people copy today and
// a shared bucket that does not adapt run alongside,
// against the token bucket, for comparison: they only have to complete.
// All scenarios run at once, each with its own server, bucket keys and
// worker processes.
func TestAdaptiveFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("the adaptive fleet test takes about 40s")
	}
	addr := redistest.Addr(t)
	tokenBucket := llmtest.TokenBucket(adaptiveHidden, time.Second, adaptiveHidden)
	sluice := fmt.Sprintf("sluice, Redis bucket %d/s, adaptive, cold start", adaptiveCeiling)
	// The ceiling is a guess, and so is its burst: the fleet starts cold.
	coldStart := adaptive.Policy{ColdStart: true}
	scenarios := []adaptiveScenario{
		// Measured over five runs (429s / x ideal): token bucket 1.2-1.5% /
		// 1.03-1.04; with headers 0.2-0.3% / 1.00-1.01; fixed window
		// 1.2-1.5% / 1.05-1.09; sliding window 1.3-1.7% / 1.10-1.12. The
		// window servers lose a second to every pause (Retry-After in whole
		// seconds), and the sliding one now and then refuses one call at
		// 19.6/s, where two cuts of 0.7 leave the rate, when scheduling
		// bunches a few; its makespan is asserted with a margin for a run
		// with more of them. With the default policy (warm start) the first
		// second draws some 20 429s: 32 calls at once into a ceiling burst
		// of 40 against a server burst of 20, and as many again from the 8
		// tokens left (token bucket 4.3%, with headers 1.8%, fixed window
		// 4.8%, sliding window 4.3% in one run).
		{name: "token-bucket", limit: tokenBucket, mode: modeSluice, client: sluice, policy: coldStart,
			target429: 0.05, targetMakespan: 1.15, max429: 0.05, maxMakespan: 1.15},
		{name: "token-bucket-openai-headers", limit: tokenBucket, headers: llmtest.OpenAIHeaders, mode: modeSluice, client: sluice, policy: coldStart,
			target429: 0.01, targetMakespan: 1.15, max429: 0.01, maxMakespan: 1.15},
		{name: "fixed-window", limit: llmtest.FixedWindow(adaptiveHidden, time.Second), mode: modeSluice, client: sluice, policy: coldStart,
			target429: 0.05, targetMakespan: 1.15, max429: 0.05, maxMakespan: 1.15},
		{name: "sliding-window", limit: llmtest.SlidingWindow(adaptiveHidden, time.Second), mode: modeSluice, client: sluice, policy: coldStart,
			target429: 0.05, targetMakespan: 1.15, max429: 0.05, maxMakespan: 1.3},
		{name: "recipe", limit: tokenBucket, mode: modeRecipe,
			client: fmt.Sprintf("per-goroutine recipe, x/time/rate %.2f/s each", float64(adaptiveCeiling)/(adaptiveProcs*adaptiveGoroutines))},
		{name: "no-adaptation", limit: tokenBucket, mode: modeStatic, client: fmt.Sprintf("sluice, Redis bucket %d/s, Observe off", adaptiveCeiling)},
	}
	// The runs are started together in goroutines rather than as parallel
	// subtests, which -test.parallel (GOMAXPROCS by default) would queue.
	type outcome struct {
		run adaptiveRun
		err error
	}
	outcomes := make([]outcome, len(scenarios))
	began := time.Now()
	var wg sync.WaitGroup
	for i, sc := range scenarios {
		wg.Go(func() {
			r, err := runAdaptiveFleet(addr, sc)
			outcomes[i] = outcome{r, err}
		})
	}
	wg.Wait()
	// A scenario that missed a bound while the machine stalled is made
	// again, alone, up to adaptiveRuns in all: a machine that stops running
	// the fleet for a while sends the calls due meanwhile at once when it
	// resumes (429s, a cut, a second lost to a pause). That measures the
	// machine, not sluice. Errors and lost calls fail at once.
	for i, sc := range scenarios {
		for n := 1; n < adaptiveRuns && outcomes[i].err == nil && sc.missedTimely(outcomes[i].run) && outcomes[i].run.stall >= adaptiveStall; n++ {
			r := outcomes[i].run
			t.Logf("%s: run %d missed a bound (%d 429s, makespan %.2fs) while the machine stalled for %v: once more",
				sc.name, n, r.stats.Rejected, r.makespan.Seconds(), r.stall.Round(time.Millisecond))
			r, err := runAdaptiveFleet(addr, sc)
			outcomes[i] = outcome{r, err}
		}
	}
	wall := time.Since(began)
	runs := make(map[string]adaptiveRun)
	for i, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			r, err := outcomes[i].run, outcomes[i].err
			require.NoError(t, err)
			runs[sc.name] = r
			adm := make([]string, len(r.series))
			for i, p := range r.series {
				adm[i] = strconv.FormatInt(p.Requests, 10)
			}
			t.Logf("server saw %d requests, %d rejected (workers counted %d 429s); first attempts within %v of the start\n429s by second: %s\nadmitted by second: %s\ndecreases (time: fraction of the ceiling): %s",
				r.stats.Accepted+r.stats.Rejected, r.stats.Rejected, r.throttled, r.lag.Round(time.Millisecond), r.by429, strings.Join(adm, " "), r.cuts)
			assert.Empty(t, r.errs, "errors")
			assert.Equal(t, adaptiveCalls, r.ok+r.notOK+r.failed, "every call completes")
			if sc.max429 == 0 {
				return
			}
			assert.Equal(t, adaptiveCalls, r.ok, "every call succeeds")
			assert.LessOrEqual(t, float64(r.stats.Rejected), sc.max429*adaptiveCalls,
				"429s at most %.0f%% of the calls", 100*sc.max429)
			assert.LessOrEqual(t, r.makespan.Seconds(), sc.maxMakespan*adaptiveIdeal.Seconds(),
				"makespan at most %.2f x the ideal %v", sc.maxMakespan, adaptiveIdeal)
		})
	}

	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%d processes x %d goroutines, %d calls, hidden limit %d/s, ceiling %d/s; ideal makespan %.0fs ((calls-burst)/rate); all runs at once, wall time %.1fs\n",
		adaptiveProcs, adaptiveGoroutines, adaptiveCalls, adaptiveHidden, adaptiveCeiling, adaptiveIdeal.Seconds(), wall.Seconds())
	fmt.Fprintf(&sb, "%-28s %-50s %-44s %5s %6s %5s %6s %7s %9s %7s  %s\n",
		"run", "server", "client", "ok", "failed", "429s", "429 %", "calls/s", "makespan", "x ideal", "issue 4 target")
	for _, sc := range scenarios {
		r, ok := runs[sc.name]
		if !ok {
			continue
		}
		server := sc.limit.String()
		if sc.headers&llmtest.OpenAIHeaders != 0 {
			server += ", OpenAI headers"
		}
		target := ""
		if sc.target429 > 0 {
			target = fmt.Sprintf("429s <= %.0f%%: %s, makespan <= %.2fx: %s", 100*sc.target429,
				met(float64(r.stats.Rejected) <= sc.target429*adaptiveCalls), sc.targetMakespan,
				met(r.makespan.Seconds() <= sc.targetMakespan*adaptiveIdeal.Seconds()))
		}
		fmt.Fprintf(&sb, "%-28s %-50s %-44s %5d %6d %5d %5.1f%% %7.1f %8.2fs %7.3f  %s\n",
			sc.name, server, sc.client, r.ok, r.notOK+r.failed, r.stats.Rejected,
			100*float64(r.stats.Rejected)/adaptiveCalls, float64(r.ok)/r.makespan.Seconds(),
			r.makespan.Seconds(), r.makespan.Seconds()/adaptiveIdeal.Seconds(), target)
	}
	t.Log(sb.String())
	// Against the same server, sluice draws at most a third of the 429s the
	// per-worker recipe does, and a tenth of what no adaptation does.
	if sl, ok := runs["token-bucket"]; ok {
		if rc, ok := runs["recipe"]; ok {
			assert.Less(t, 3*sl.stats.Rejected, rc.stats.Rejected, "sluice against the recipe")
		}
		if na, ok := runs["no-adaptation"]; ok {
			assert.Less(t, 10*sl.stats.Rejected, na.stats.Rejected, "sluice against no adaptation")
		}
	}
}

// How late a timer of a worker or of the server must come
// (fleettest.WatchStalls) for a scenario's run that missed a bound to be
// made again, and the most runs a scenario gets.
const (
	adaptiveStall = 100 * time.Millisecond
	adaptiveRuns  = 3
)

// missedTimely reports whether r, every call of it a success, missed one of
// sc's bounds a stalled machine can break: its 429s or its makespan. A run
// with errors or calls that failed is not one: a rerun would hide them.
func (sc adaptiveScenario) missedTimely(r adaptiveRun) bool {
	if sc.max429 == 0 || len(r.errs) > 0 || r.ok != adaptiveCalls {
		return false
	}
	return float64(r.stats.Rejected) > sc.max429*adaptiveCalls ||
		r.makespan.Seconds() > sc.maxMakespan*adaptiveIdeal.Seconds()
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// runAdaptiveFleet runs sc's server and worker processes and returns what
// they measured. It kills its workers if it fails.
func runAdaptiveFleet(addr string, sc adaptiveScenario) (adaptiveRun, error) {
	srv := llmtest.NewServer(llmtest.Config{Requests: sc.limit, Headers: sc.headers})
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var procs []*fleettest.Worker
	defer func() {
		cancel() // kills the workers still running
		for _, p := range procs {
			p.Wait() // a no-op once waited for
		}
	}()
	prefix := fmt.Sprintf("sluice-adaptive-%s-%d", sc.name, time.Now().UnixNano())
	share := adaptiveCalls / adaptiveProcs
	for i := range adaptiveProcs {
		calls := share
		if i == 0 {
			calls += adaptiveCalls - share*adaptiveProcs
		}
		p, err := fleettest.Start(ctx, adaptiveWorkerEnv, adaptiveWorkerConfig{
			Mode: sc.mode, Redis: addr, Prefix: prefix, URL: srv.URL + "/ping",
			Calls: calls, Goroutines: adaptiveGoroutines, Fleet: adaptiveProcs * adaptiveGoroutines,
			Ceiling: adaptiveCeiling, Policy: sc.policy,
		})
		if err != nil {
			return adaptiveRun{}, err
		}
		procs = append(procs, p)
	}
	if err := fleettest.AwaitReady(procs); err != nil {
		return adaptiveRun{}, err
	}
	srv.Reset() // counters and Series from about the start
	start := time.Now().Add(100 * time.Millisecond)
	cuts := fleettest.WatchDecreases(ctx, addr, prefix+":{adaptive-fleet}", start)
	if err := fleettest.Release(procs, start); err != nil {
		return adaptiveRun{}, err
	}
	stalls := fleettest.WatchStalls() // of the server, in this process
	var run adaptiveRun
	var last int64
	for i, p := range procs {
		var r adaptiveResult
		if err := p.Report(i, &r); err != nil {
			return adaptiveRun{}, err
		}
		if r.Err != "" {
			run.errs = append(run.errs, fmt.Sprintf("worker %d: %s", i+1, r.Err))
		}
		run.ok += r.OK
		run.notOK += r.NotOK
		run.failed += r.Failed
		run.throttled += r.Throttled
		last = max(last, r.Last)
		run.lag = max(run.lag, time.Unix(0, r.First).Sub(start))
		run.stall = max(run.stall, r.Stall)
	}
	run.makespan = time.Unix(0, last).Sub(start)
	run.stall = max(run.stall, stalls())
	run.stats = srv.Stats()
	run.series = srv.Series(time.Second)
	var by []string
	for i, pt := range run.series {
		if pt.Rejected > 0 {
			by = append(by, fmt.Sprintf("%d:%d", i, pt.Rejected))
		}
	}
	run.by429 = strings.Join(by, " ")
	run.cuts = cuts()
	return run, nil
}
