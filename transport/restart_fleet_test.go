package transport_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/fleettest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
)

// The restart fleet: restartProcs processes of restartGoroutines goroutines
// make restartCalls calls in all (restartCalls/restartProcs each) through
// one Redis bucket at the server's own limit, restartRate per second with a
// burst of restartRate; restartStopAt after the start the Redis server is
// killed, and restartDownFor later started again, empty, on the same port.
const (
	restartProcs      = 4
	restartGoroutines = 8
	restartCalls      = 300
	restartRate       = 20
	restartStopAt     = 4 * time.Second
	restartDownFor    = 3 * time.Second
	// restartMax429 is the bound on 429s at the upstream, as a
	// fraction of the calls (not of the requests, which the 429s' retries
	// add to).
	restartMax429 = 0.05
	// restartCallTimeout bounds one call in a worker, retries included.
	restartCallTimeout = 20 * time.Second
	// restartBin is the width of the timeline's intervals.
	restartBin = 500 * time.Millisecond
)

// restartIdeal is the least makespan the server's limit allows: its burst
// at once, then restartRate per second.
const restartIdeal = time.Duration(float64(restartCalls-restartRate) / restartRate * float64(time.Second))

const (
	// restartWorkerEnv holds, in a worker process of TestFleetRedisRestart
	// (this test binary started again), its restartWorkerConfig as JSON.
	restartWorkerEnv = "SLUICE_TRANSPORT_RESTART_WORKER"
	// restartCallHeader names each call, "<worker>-<n>", on every attempt:
	// the server tells the attempts of a call by it.
	restartCallHeader = "X-Sluice-Test-Call"
)

// restartWorkerConfig is what a worker process is told to do.
type restartWorkerConfig struct {
	Index int // from 1
	Redis string
	URL   string
	Calls int
}

// restartSlot is one reservation a worker's bucket granted: when Reserve
// returned and when the slot was due (returned plus Delay), in nanoseconds
// since the start, and whether the fail-open share bucket granted it (the
// Redis breaker was not closed when Reserve returned).
type restartSlot struct {
	Worker  int
	At, Due int64
	Share   bool
	Err     string `json:",omitempty"`
}

// restartEvent is a state change of a worker's Redis breaker, in
// nanoseconds since the start: to "open" the worker goes to its share
// bucket; "half-open" lets one call probe Redis, the others still going to
// the share bucket; "closed" is back on Redis.
type restartEvent struct {
	Worker   int
	At       int64
	From, To string
}

// restartResult is what a worker prints on stdout when it is done.
type restartResult struct {
	OK, NotOK, Failed int
	Last              int64 // Unix nanoseconds of its last completion
	Err               string
	Slots             []restartSlot
	Events            []restartEvent
	Observed          [2]int // 429s observed: by Redis, by the share bucket
}

// restartWorker runs one worker process of TestFleetRedisRestart and
// returns its exit code. It prints "ready" once set up, reads the Unix
// nanoseconds at which to begin from stdin, makes its calls, then prints a
// restartResult. It logs the state changes of its Redis breaker to stderr
// as they happen.
//
// The client is the issue's: transport.New(nil, WithBucket(NewRedis(rdb,
// PerSecond(restartRate)))), default key, retry policy and failure policy
// (fail open), one Transport shared by the process's goroutines. Two
// things watch it without changing what it does: the breaker's
// OnStateChange (zero Settings fields keep sluice's defaults), and a
// Bucket that passes every call to the Redis bucket and records the
// reservations.
func restartWorker() int {
	var cfg restartWorkerConfig
	if err := json.Unmarshal([]byte(os.Getenv(restartWorkerEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "restart worker: config:", err)
		return 2
	}
	var start atomic.Int64 // Unix ns; 0 until known
	since := func(t time.Time) int64 {
		if s := start.Load(); s != 0 {
			return t.UnixNano() - s
		}
		return 0
	}
	var (
		mu     sync.Mutex // guards events, and stderr
		events []restartEvent
		state  atomic.Int32 // gobreaker.State of the Redis breaker
	)
	onChange := func(_ string, from, to gobreaker.State) {
		state.Store(int32(to))
		ev := restartEvent{Worker: cfg.Index, At: since(time.Now()), From: from.String(), To: to.String()}
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
		fmt.Fprintf(os.Stderr, "worker %d %+8.3fs redis breaker %s -> %s: %s\n", cfg.Index,
			time.Duration(ev.At).Seconds(), from, to, restartMeaning[to.String()])
	}

	rdb := redis.NewClient(&redis.Options{Addr: cfg.Redis})
	defer rdb.Close()
	b := bucket.NewRedis(rdb, bucket.PerSecond(restartRate),
		bucket.WithRedisBreaker(gobreaker.Settings{OnStateChange: onChange}))
	// Load the scripts, connect and join the fleet's membership before
	// the start, on a key of its own.
	if _, err := b.Reserve(context.Background(), "warm-up", bucket.N(1), 0); err != nil {
		fmt.Fprintln(os.Stderr, "restart worker: redis:", err)
		return 2
	}
	rec := &recordingBucket{Bucket: b, worker: cfg.Index, since: since, state: &state}
	client := &http.Client{Transport: transport.New(nil, transport.WithBucket(rec))}
	defer client.CloseIdleConnections()

	startAt, err := fleettest.Ready()
	if err != nil {
		fmt.Fprintln(os.Stderr, "restart worker:", err)
		return 2
	}
	start.Store(startAt.UnixNano())
	time.Sleep(time.Until(startAt))

	var (
		res  restartResult
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range restartGoroutines {
		wg.Go(func() {
			for {
				n := next.Add(1)
				if n > int64(cfg.Calls) {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), restartCallTimeout)
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.URL, nil)
				var resp *http.Response
				if err == nil {
					req.Header.Set(restartCallHeader, fmt.Sprintf("%d-%d", cfg.Index, n))
					resp, err = client.Do(req)
				}
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				cancel()
				now := time.Now()
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
				res.Last = max(res.Last, now.UnixNano())
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	mu.Lock()
	res.Events = events
	mu.Unlock()
	res.Slots = rec.slots()
	rec.mu.Lock()
	res.Observed = rec.observed
	rec.mu.Unlock()
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

// restartMeaning says what a state of the Redis breaker means for a
// fail-open bucket.
var restartMeaning = map[string]string{
	"open":      "calls go to the share bucket",
	"half-open": "one call probes Redis, the others go to the share bucket",
	"closed":    "calls go to Redis",
}

// recordingBucket is a Bucket that passes every call to Bucket and records
// the reservations Reserve grants.
type recordingBucket struct {
	bucket.Bucket
	worker int
	since  func(time.Time) int64
	state  *atomic.Int32 // of the Redis breaker

	mu       sync.Mutex
	got      []restartSlot
	observed [2]int // throttled responses observed: by Redis, by the share bucket
}

func (b *recordingBucket) Reserve(ctx context.Context, key string, cost bucket.Cost, maxWait time.Duration) (bucket.Reservation, error) {
	r, err := b.Bucket.Reserve(ctx, key, cost, maxWait)
	if err == nil && !r.OK {
		return r, err
	}
	at := b.since(time.Now())
	s := restartSlot{Worker: b.worker, At: at, Due: at + int64(r.Delay),
		Share: gobreaker.State(b.state.Load()) != gobreaker.StateClosed}
	if err != nil {
		s.Err = err.Error()
	}
	b.mu.Lock()
	b.got = append(b.got, s)
	b.mu.Unlock()
	return r, err
}

func (b *recordingBucket) Observe(ctx context.Context, key string, fb adaptive.Feedback) error {
	err := b.Bucket.Observe(ctx, key, fb)
	if fb.Class == adaptive.RateLimited || fb.Class == adaptive.Overloaded {
		share := gobreaker.State(b.state.Load()) != gobreaker.StateClosed
		b.mu.Lock()
		if share {
			b.observed[1]++
		} else {
			b.observed[0]++
		}
		b.mu.Unlock()
	}
	return err
}

func (b *recordingBucket) slots() []restartSlot {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.got)
}

// restartReq is one request the server saw.
type restartReq struct {
	At      time.Duration // since the start, on arrival
	Status  int
	Call    string // restartCallHeader
	RetryMs int64  // retry-after-ms of a 429; -1 if none
}

// restartRecorder is an http.Handler that passes requests to next and
// records them.
type restartRecorder struct {
	next  http.Handler
	start atomic.Int64 // Unix ns

	mu   sync.Mutex
	reqs []restartReq
}

func (rr *restartRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Since(time.Unix(0, rr.start.Load()))
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	rr.next.ServeHTTP(sw, r)
	q := restartReq{At: at, Status: sw.status, Call: r.Header.Get(restartCallHeader), RetryMs: -1}
	if v, err := strconv.ParseInt(w.Header().Get("Retry-After-Ms"), 10, 64); err == nil {
		q.RetryMs = v
	}
	rr.mu.Lock()
	rr.reqs = append(rr.reqs, q)
	rr.mu.Unlock()
}

func (rr *restartRecorder) requests() []restartReq {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return slices.Clone(rr.reqs)
}

// statusWriter records the status of a response.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// restartSample is the Redis bucket's key as a watcher saw it.
type restartSample struct {
	At     time.Duration // since the start, when the reading returned
	Up     bool          // Redis answered
	Exists bool          // the key's hash of tokens exists
	Tokens float64       // bucket.Redis.Tokens: negative is debt
	Epoch  string        // the key's adaptive state (redis_lua.go): decreases so far
	Frac   float64       // the fraction of the ceiling after the last decrease; 1 if none
	Cut    time.Duration // when the last decrease happened, since the start
}

// restartRun is what one run of the restart fleet measured.
type restartRun struct {
	ok, notOK, failed int
	errs              []string
	stats             llmtest.Stats
	maxAdmitted       int64 // in any 1 s window, by the server's clock
	makespan          time.Duration
	stopAt            time.Duration // Redis killed
	restartAt, upAt   time.Duration // Redis started again; answering
	members           int64         // the fleet's size in Redis before the kill
	observed          [2]int        // 429s observed: by Redis, by the share buckets
	reqs              []restartReq
	slots             []restartSlot
	events            []restartEvent
	samples           []restartSample
	stderr            []string // each worker's
}

// TestFleetRedisRestart is the acceptance test of the issue "Fleet: 4
// processes x 8 goroutines, 300 calls at a known 20/s (burst 20) against a
// server that answers 429 with retry-after-ms, Redis stopped 4 s in for 3 s
// and restarted empty: 300/300 ok and at most 5% of calls answered 429,
// in five runs out of five." The processes share one Redis bucket at the
// server's limit and fail open (the default) to their share of it while
// Redis is down. It asserts the targets and reports the figures
// and the timeline.
func TestFleetRedisRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("the restart fleet test takes about 20s")
	}
	rs := redistest.Own(t)
	run, err := runRestartFleet(rs)
	require.NoError(t, err)
	for i, s := range run.stderr {
		if s != "" {
			t.Logf("worker %d stderr:\n%s", i+1, s)
		}
	}
	t.Log(run.report())

	assert.Empty(t, run.errs, "errors")
	assert.Equal(t, restartCalls, run.ok+run.notOK+run.failed, "every call returns")
	assert.Positive(t, run.stats.Accepted, "the server admitted calls")
	seen := run.stats.Accepted + run.stats.Rejected
	assert.Equal(t, restartCalls, run.ok, "every call succeeds")
	assert.LessOrEqual(t, float64(run.stats.Rejected), restartMax429*restartCalls,
		"429s at the upstream at most %.0f%% of the %d calls (%d requests)", 100*restartMax429, restartCalls, seen)
}

// runRestartFleet runs the server, the worker processes and the Redis
// outage, and returns what they measured. It kills its workers if it fails.
func runRestartFleet(rs *redistest.Server) (restartRun, error) {
	h := llmtest.NewHandler(llmtest.Config{
		Requests:     llmtest.TokenBucket(restartRate, time.Second, restartRate),
		RetryAfterMs: true,
	})
	rr := &restartRecorder{next: h}
	srv := httptest.NewServer(rr)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var (
		procs  []*fleettest.Worker
		outage sync.WaitGroup // the goroutine that stops and restarts Redis
	)
	defer func() {
		cancel() // kills the workers still running, and ends the outage
		for _, p := range procs {
			p.Wait() // a no-op once waited for
		}
		outage.Wait()
	}()
	share := restartCalls / restartProcs
	for i := range restartProcs {
		calls := share
		if i == 0 {
			calls += restartCalls - share*restartProcs
		}
		p, err := fleettest.Start(ctx, restartWorkerEnv, restartWorkerConfig{Index: i + 1, Redis: rs.Addr, URL: srv.URL + "/v1/ping", Calls: calls})
		if err != nil {
			return restartRun{}, err
		}
		procs = append(procs, p)
	}
	if err := fleettest.AwaitReady(procs); err != nil {
		return restartRun{}, err
	}

	var run restartRun
	prdb := redis.NewClient(&redis.Options{Addr: rs.Addr, MaxRetries: -1,
		DialTimeout: 100 * time.Millisecond, ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond})
	defer prdb.Close()
	run.members, _ = prdb.ZCard(ctx, "sluice:members").Result()

	h.Reset() // counters and admissions from about the start
	start := time.Now().Add(100 * time.Millisecond)
	rr.start.Store(start.UnixNano())
	key := transport.HostKey(httptest.NewRequest(http.MethodGet, srv.URL, nil))
	samples := watchRestartKey(ctx, prdb, key, start)
	// The outage; its times and error are read once it is done.
	var (
		stopAt, restartAt, upAt time.Duration
		outageErr               error
	)
	outage.Go(func() {
		t := time.NewTimer(time.Until(start.Add(restartStopAt)))
		defer t.Stop()
		select {
		case <-ctx.Done():
			outageErr = ctx.Err()
			return
		case <-t.C:
		}
		rs.Stop()
		stopAt = time.Since(start)
		t.Reset(restartDownFor)
		select {
		case <-ctx.Done():
			outageErr = ctx.Err()
			return
		case <-t.C:
		}
		restartAt = time.Since(start)
		outageErr = rs.Restart()
		upAt = time.Since(start)
	})
	if err := fleettest.Release(procs, start); err != nil {
		return restartRun{}, err
	}

	var last int64
	for i, p := range procs {
		var r restartResult
		if err := p.Report(i, &r); err != nil {
			return restartRun{}, err
		}
		if r.Err != "" {
			run.errs = append(run.errs, fmt.Sprintf("worker %d: %s", i+1, r.Err))
		}
		run.ok += r.OK
		run.notOK += r.NotOK
		run.failed += r.Failed
		run.observed[0] += r.Observed[0]
		run.observed[1] += r.Observed[1]
		last = max(last, r.Last)
		run.slots = append(run.slots, r.Slots...)
		run.events = append(run.events, r.Events...)
		run.stderr = append(run.stderr, p.Stderr())
	}
	outage.Wait()
	if outageErr != nil {
		return restartRun{}, fmt.Errorf("redis outage: %w", outageErr)
	}
	run.stopAt, run.restartAt, run.upAt = stopAt, restartAt, upAt
	run.samples = samples()
	run.makespan = time.Unix(0, last).Sub(start)
	run.stats = h.Stats()
	run.maxAdmitted = h.MaxInWindow(llmtest.Requests, time.Second)
	run.reqs = rr.requests()
	return run, nil
}

// watchRestartKey samples key's Redis bucket every 25 ms until ctx is done
// or the returned function is called, which returns the samples. It reads
// the tokens through a bucket of its own that fails closed and changes
// nothing (Tokens), and the adaptive state as the Lua scripts keep it.
func watchRestartKey(ctx context.Context, rdb *redis.Client, key string, start time.Time) func() []restartSample {
	b := bucket.NewRedis(rdb, bucket.PerSecond(restartRate), bucket.WithFailClosed(),
		bucket.WithRedisBreaker(gobreaker.Settings{Timeout: 10 * time.Millisecond}))
	base := "sluice:{" + key + "}" // the key layout of bucket's scripted.go
	hash := base + ":" + bucket.Requests
	ctx, cancel := context.WithCancel(ctx)
	var (
		samples []restartSample // read once done is closed
		done    = make(chan struct{})
	)
	go func() {
		defer close(done)
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var s restartSample
			n, err := rdb.Exists(ctx, hash).Result()
			var c bucket.Cost
			if err == nil {
				c, err = b.Tokens(ctx, key)
			}
			var st []any
			if err == nil {
				st, err = rdb.HMGet(ctx, base, "e", "a", "d").Result()
			}
			s.At = time.Since(start)
			if err == nil {
				s.Up, s.Exists, s.Tokens, s.Frac, s.Cut = true, n == 1, c[bucket.Requests], 1, -1
				s.Epoch, _ = st[0].(string)
				if a, err := strconv.ParseFloat(fmt.Sprint(st[1]), 64); err == nil {
					s.Frac = a / 1e6
				}
				if d, err := strconv.ParseInt(fmt.Sprint(st[2]), 10, 64); err == nil {
					s.Cut = time.UnixMicro(d).Sub(start)
				}
			}
			if ctx.Err() == nil {
				samples = append(samples, s)
			}
		}
	}()
	return func() []restartSample {
		cancel()
		<-done
		return samples
	}
}

// tally counts the requests the server saw in [from, to).
type tally struct{ sent, ok, rejected int }

func (run *restartRun) tally(from, to time.Duration) tally {
	var c tally
	for _, q := range run.reqs {
		if q.At >= from && q.At < to {
			c.sent++
			if q.Status == http.StatusTooManyRequests {
				c.rejected++
			} else {
				c.ok++
			}
		}
	}
	return c
}

func (c tally) String() string {
	return fmt.Sprintf("%d sent, %d admitted, %d answered 429", c.sent, c.ok, c.rejected)
}

// report describes run: the figures, what explains the 429s, and the
// timeline by restartBin.
func (run *restartRun) report() string {
	var sb strings.Builder
	seen := run.stats.Accepted + run.stats.Rejected
	pct := 100 * float64(run.stats.Rejected) / restartCalls // of the calls
	fmt.Fprintf(&sb, "\n%d processes x %d goroutines, %d calls, server token bucket %d/s burst %d with retry-after-ms; Redis killed at %.2fs, started again (empty) at %.2fs, answering at %.2fs; %d members in Redis before\n",
		restartProcs, restartGoroutines, restartCalls, restartRate, restartRate, run.stopAt.Seconds(), run.restartAt.Seconds(), run.upAt.Seconds(), run.members)
	fmt.Fprintf(&sb, "FIGURES: %d ok, %d failed (%d answered 429 after the last attempt, %d errors); server saw %d requests, %d answered 429 (%.1f%% of the calls, target <= %.0f%%); makespan %.2fs (ideal %.0fs, x%.2f); most admitted in 1 s: %d, most sent in 1 s: %d\n",
		run.ok, run.notOK+run.failed, run.notOK, run.failed, seen, run.stats.Rejected, pct, 100*restartMax429,
		run.makespan.Seconds(), restartIdeal.Seconds(), run.makespan.Seconds()/restartIdeal.Seconds(), run.maxAdmitted, run.maxSent(time.Second))

	// The breaker: when each worker went to its share bucket and back.
	fallAt, backAt := map[int]int64{}, map[int]int64{}
	probes := map[int]int{}
	for _, e := range run.events {
		switch {
		case e.To == "open":
			if _, ok := fallAt[e.Worker]; !ok {
				fallAt[e.Worker] = e.At
			}
		case e.To == "half-open":
			probes[e.Worker]++
		case e.To == "closed":
			backAt[e.Worker] = e.At
		}
	}
	firstFall, firstBack, lastBack := int64(-1), int64(-1), int64(-1)
	sb.WriteString("fail-open (Redis breaker):")
	for w := 1; w <= restartProcs; w++ {
		f, okf := fallAt[w]
		b, okb := backAt[w]
		if okf && (firstFall < 0 || f < firstFall) {
			firstFall = f
		}
		if okb && (firstBack < 0 || b < firstBack) {
			firstBack = b
		}
		if okb {
			lastBack = max(lastBack, b)
		}
		fmt.Fprintf(&sb, " worker %d share %s-%s (%d probes);", w, secsOf(f, okf), secsOf(b, okb), probes[w])
	}
	fmt.Fprintf(&sb, " Observe of 429s: %d by Redis, %d by the share buckets\n", run.observed[0], run.observed[1])

	// The kill: the Redis debt still to come, and the share buckets on top.
	stop := int64(run.stopAt)
	var before *restartSample
	for i := range run.samples {
		if s := &run.samples[i]; s.At < run.stopAt && s.Up {
			before = s
		}
	}
	debt, debtEnd := 0, stop
	for _, s := range run.slots {
		if !s.Share && s.Err == "" && s.At < stop && s.Due >= stop {
			debt++
			debtEnd = max(debtEnd, s.Due)
		}
	}
	onTop, atOnce := 0, 0
	for _, s := range run.slots {
		if !s.Share || s.Err != "" {
			continue
		}
		if s.Due < debtEnd {
			onTop++
		}
		if f, ok := fallAt[s.Worker]; ok && s.At < f+int64(time.Second) && s.Due-s.At < int64(time.Millisecond) {
			atOnce++
		}
	}
	sb.WriteString("KILL: ")
	if before != nil {
		fmt.Fprintf(&sb, "Redis bucket at %.1f tokens (%.2fs); ", before.Tokens, before.At.Seconds())
	}
	span := time.Duration(debtEnd - stop)
	fmt.Fprintf(&sb, "%d slots reserved on Redis still to come, due %.2fs-%.2fs (%.0f/s); share buckets from %s: %d slots granted at once (all workers, each in its first second), %d share slots due before %.2fs; in [%.2fs, %.2fs): %s (the limit allows %.0f)\n",
		debt, run.stopAt.Seconds(), time.Duration(debtEnd).Seconds(), float64(debt)/max(span.Seconds(), 1e-3),
		secsOf(firstFall, firstFall >= 0), atOnce, onTop, time.Duration(debtEnd).Seconds(),
		run.stopAt.Seconds(), time.Duration(debtEnd).Seconds(), run.tally(run.stopAt, time.Duration(debtEnd)), span.Seconds()*restartRate)
	// The share buckets' rate once the Redis debt is done, all workers
	// saturated: their own adaptive law may have cut it.
	if from, to := debtEnd+int64(250*time.Millisecond), firstBack; firstBack >= 0 && to > from {
		k := 0
		for _, s := range run.slots {
			if s.Share && s.Err == "" && s.Due >= from && s.Due < to {
				k++
			}
		}
		fmt.Fprintf(&sb, "  share buckets' slots due in [%.2fs, %.2fs): %.1f/s in all (their shares add up to %d/s)\n",
			time.Duration(from).Seconds(), time.Duration(to).Seconds(), float64(k)/time.Duration(to-from).Seconds(), restartRate)
	}

	// The restart: the Redis key anew, and the share debt still to come.
	var after *restartSample
	for i := range run.samples {
		if s := &run.samples[i]; s.At >= run.restartAt && s.Up {
			after = s
			break
		}
	}
	carried, carriedEnd := 0, int64(firstBack)
	carriedBy := make([]string, restartProcs)
	for w := range carriedBy {
		k := 0
		for _, s := range run.slots {
			if b, ok := backAt[s.Worker]; ok && s.Worker == w+1 && s.Share && s.Err == "" && s.Due >= b {
				k++
				carriedEnd = max(carriedEnd, s.Due)
			}
		}
		carried += k
		carriedBy[w] = strconv.Itoa(k)
	}
	fresh, freshAtOnce := 0, 0
	for _, s := range run.slots {
		if !s.Share && s.Err == "" && firstBack >= 0 && s.At >= firstBack && s.Due < carriedEnd {
			fresh++
			if s.Due-s.At < int64(time.Millisecond) {
				freshAtOnce++
			}
		}
	}
	sb.WriteString("RESTART: ")
	if after != nil {
		fmt.Fprintf(&sb, "first reading %.1f tokens at %.2fs (key exists: %v); ", after.Tokens, after.At.Seconds(), after.Exists)
	}
	if firstBack >= 0 {
		fmt.Fprintf(&sb, "workers back on Redis %.2fs-%.2fs with %d share slots still to come (by worker: %s), due until %.2fs; %d Redis slots due before then (%d granted at once); in [%.2fs, %.2fs): %s (the limit allows %.0f)\n",
			time.Duration(firstBack).Seconds(), time.Duration(lastBack).Seconds(), carried, strings.Join(carriedBy, "+"), time.Duration(carriedEnd).Seconds(),
			fresh, freshAtOnce, time.Duration(firstBack).Seconds(), time.Duration(carriedEnd).Seconds(),
			run.tally(time.Duration(firstBack), time.Duration(carriedEnd)), time.Duration(carriedEnd-firstBack).Seconds()*restartRate)
	} else {
		sb.WriteString("no worker went back to Redis\n")
	}
	sb.WriteString("  Redis tokens after the restart:")
	n := 0
	for _, s := range run.samples {
		if s.At >= run.restartAt && s.Up && n < 10 {
			mark := ""
			if !s.Exists {
				mark = "*"
			}
			fmt.Fprintf(&sb, " %.2fs:%.1f%s", s.At.Seconds(), s.Tokens, mark)
			n++
		}
	}
	sb.WriteString(" (*: no key, counted full)\n")

	// The rate: the decreases the Redis key's adaptive state records.
	sb.WriteString("  Redis rate decreases (when: epoch, fraction of 20/s):")
	seenCut := map[string]bool{}
	for _, s := range run.samples {
		if !s.Up || s.Epoch == "" {
			continue
		}
		id := fmt.Sprintf("%s@%d", s.Epoch, s.Cut)
		if seenCut[id] {
			continue
		}
		seenCut[id] = true
		fmt.Fprintf(&sb, " %.2fs: %s, %.2f;", s.Cut.Seconds(), s.Epoch, s.Frac)
	}
	sb.WriteString("\n")

	// 429s: when, on which attempt, what they asked for, and the calls lost.
	calls := map[string][]restartReq{}
	for _, q := range run.reqs {
		calls[q.Call] = append(calls[q.Call], q)
	}
	byAttempt := map[int]int{}
	var ms, gaps []int64
	var lost []string
	for _, qs := range calls {
		slices.SortFunc(qs, func(a, b restartReq) int { return int(a.At - b.At) })
		for i, q := range qs {
			if q.Status != http.StatusTooManyRequests {
				continue
			}
			byAttempt[min(i+1, 3)]++
			if q.RetryMs >= 0 {
				ms = append(ms, q.RetryMs)
			}
			if i+1 < len(qs) {
				gaps = append(gaps, (qs[i+1].At - q.At).Milliseconds())
			}
		}
		if l := qs[len(qs)-1]; l.Status == http.StatusTooManyRequests {
			var at []string
			for _, q := range qs {
				at = append(at, fmt.Sprintf("%.2f", q.At.Seconds()))
			}
			lost = append(lost, fmt.Sprintf("%s@%ss", l.Call, strings.Join(at, ",")))
		}
	}
	slices.Sort(lost)
	end := run.makespan + time.Second
	fmt.Fprintf(&sb, "429s: %d before the kill, %d while the Redis debt came due, %d later in the outage, %d from the first return to Redis until the share debt was done, %d after; by attempt: 1st %d, 2nd %d, 3rd %d; retry-after-ms %s; next attempt after %s ms\n",
		run.tally(0, run.stopAt).rejected, run.tally(run.stopAt, time.Duration(debtEnd)).rejected,
		run.tally(time.Duration(debtEnd), time.Duration(max(firstBack, debtEnd))).rejected,
		run.tally(time.Duration(max(firstBack, debtEnd)), time.Duration(max(carriedEnd, debtEnd))).rejected,
		run.tally(time.Duration(max(carriedEnd, debtEnd)), end).rejected,
		byAttempt[1], byAttempt[2], byAttempt[3], spread(ms), spread(gaps))
	fmt.Fprintf(&sb, "lost calls (every attempt 429; call@attempt times): %d %s\n", len(lost), strings.Join(lost, " "))
	fmt.Fprintf(&sb, "slots: %d reserved, %d sent (the rest dropped: due while the process was paused by a 429)\n", len(run.slots), len(run.reqs))

	// The timeline.
	fmt.Fprintf(&sb, "%6s %5s %5s %5s %6s %6s %8s %5s  %s\n", "t (s)", "sent", "ok", "429", "redis", "share", "tokens", "rate",
		"(sent: requests the server saw; redis, share: slots due, by the bucket that granted them; tokens, rate: the Redis bucket's at the interval's start, * no key)")
	bins := int(run.makespan/restartBin) + 1
	type bin struct{ redis, share int }
	tl := make([]bin, bins)
	at := func(d int64) int { return min(max(int(d/int64(restartBin)), 0), bins-1) }
	for _, s := range run.slots {
		if s.Share {
			tl[at(s.Due)].share++
		} else {
			tl[at(s.Due)].redis++
		}
	}
	j := 0
	for i, b := range tl {
		from := time.Duration(i) * restartBin
		c := run.tally(from, from+restartBin)
		tok, rate := "-", "-"
		for ; j < len(run.samples) && run.samples[j].At < from; j++ {
		}
		if j < len(run.samples) && run.samples[j].At < from+restartBin {
			if s := run.samples[j]; s.Up {
				tok, rate = fmt.Sprintf("%.1f", s.Tokens), fmt.Sprintf("%.1f", s.Frac*restartRate)
				if !s.Exists {
					tok += "*"
				}
			} else {
				tok = "down"
			}
		}
		mark := ""
		if run.stopAt >= from && run.stopAt < from+restartBin {
			mark = fmt.Sprintf(" <- Redis killed at %.2fs", run.stopAt.Seconds())
		}
		if run.restartAt >= from && run.restartAt < from+restartBin {
			mark += fmt.Sprintf(" <- Redis restarted, empty, at %.2fs", run.restartAt.Seconds())
		}
		fmt.Fprintf(&sb, "%6.1f %5d %5d %5d %6d %6d %8s %5s%s\n", from.Seconds(), c.sent, c.ok, c.rejected, b.redis, b.share, tok, rate, mark)
	}
	return sb.String()
}

// maxSent returns the most requests the server saw in any window of w.
func (run *restartRun) maxSent(w time.Duration) int {
	at := make([]time.Duration, len(run.reqs))
	for i, q := range run.reqs {
		at[i] = q.At
	}
	slices.Sort(at)
	most, i := 0, 0
	for j := range at {
		for at[j]-at[i] >= w {
			i++
		}
		most = max(most, j-i+1)
	}
	return most
}

// secsOf formats ns nanoseconds in seconds, or "-" if not ok.
func secsOf(ns int64, ok bool) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.2fs", time.Duration(ns).Seconds())
}

// spread formats the least, the median and the most of vs.
func spread(vs []int64) string {
	if len(vs) == 0 {
		return "-"
	}
	s := slices.Sorted(slices.Values(vs))
	return fmt.Sprintf("%d/%d/%d (min/median/max)", s[0], s[len(s)/2], s[len(s)-1])
}
