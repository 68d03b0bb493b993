package transport_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/fleettest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
)

// The fleet of TestFleetAgainstRealLimiters: limitersProcs processes of
// limitersGoroutines goroutines make limitersCalls calls in all against a
// limiter of limitersRate requests per second.
const (
	limitersProcs      = 4
	limitersGoroutines = 8
	limitersCalls      = 300
	limitersRate       = 20
	// limitersCutoff ends a scenario: a call not done by then, from the
	// common start, is lost.
	limitersCutoff = 60 * time.Second
)

// limitersIdeal is the least makespan a limit of limitersRate with a burst
// of limitersRate allows: the burst at once, then limitersRate a second.
const limitersIdeal = time.Duration(float64(limitersCalls-limitersRate) / limitersRate * float64(time.Second))

// limitersWorkerEnv holds, in a worker process of
// TestFleetAgainstRealLimiters (this test binary started again), its
// limitersWorkerConfig as JSON.
const limitersWorkerEnv = "SLUICE_TRANSPORT_LIMITERS_WORKER"

// limitersWorkerConfig is what a worker process is told to do.
type limitersWorkerConfig struct {
	Redis      string
	Key        string // the one bucket key of the scenario
	URL        string
	Calls      int
	Goroutines int
	Rate       float64 // of sluice's bucket, per second
	Bucket     string  // its kind: a token bucket ("") or a limitersRecipe
}

// limitersResult is what a worker prints on stdout when it is done.
type limitersResult struct {
	OK       int   // calls whose final response is 200
	Lost     int   // calls whose final response is not 200, or an error
	Attempts int64 // requests sent, retries included
	By429    []int // 429s received by second from the start
	Last     int64 // Unix nanoseconds of its last completion
	Err      string
}

// limitersWorker runs one worker process of TestFleetAgainstRealLimiters
// and returns its exit code. It prints "ready" once set up, reads the Unix
// nanoseconds at which to begin from stdin, makes its calls through one
// http.Client whose transport.New has the defaults but a Redis bucket at
// cfg.Rate on one key, then prints a limitersResult.
func limitersWorker() int {
	var cfg limitersWorkerConfig
	if err := json.Unmarshal([]byte(os.Getenv(limitersWorkerEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "limiters worker: config:", err)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Redis, PoolSize: 2 * cfg.Goroutines})
	defer rdb.Close()
	var b bucket.Bucket
	switch cfg.Bucket {
	case "":
		b = bucket.NewRedis(rdb, bucket.PerSecond(cfg.Rate))
	case recipeColdStart:
		b = bucket.NewRedis(rdb, bucket.PerSecond(cfg.Rate), bucket.WithPolicy(adaptive.Policy{ColdStart: true}))
	case recipeBurstOne:
		b = bucket.NewRedis(rdb, bucket.Limit{Rate: cfg.Rate - 1, Burst: 1})
	case recipeSlidingLog:
		b = bucket.NewSlidingLog(rdb, bucket.PerSecond(cfg.Rate))
	default:
		fmt.Fprintln(os.Stderr, "limiters worker: no bucket", cfg.Bucket)
		return 2
	}
	// Connect and load the scripts before the start, on a key of its own.
	if _, err := b.Reserve(context.Background(), cfg.Key+"-warm-up", bucket.N(1), 0); err != nil {
		fmt.Fprintln(os.Stderr, "limiters worker: redis:", err)
		return 2
	}
	base := &http.Transport{MaxIdleConnsPerHost: 2 * cfg.Goroutines}
	defer base.CloseIdleConnections()
	var (
		start    time.Time // set before the first call
		attempts atomic.Int64
		mu       sync.Mutex
		res      limitersResult
	)
	// counted is the base transport, counting what the limiter answers.
	counted := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		attempts.Add(1)
		resp, err := base.RoundTrip(r)
		if err == nil && resp.StatusCode == http.StatusTooManyRequests {
			s := int(time.Since(start) / time.Second)
			mu.Lock()
			for len(res.By429) <= s {
				res.By429 = append(res.By429, 0)
			}
			res.By429[s]++
			mu.Unlock()
		}
		return resp, err
	})
	client := &http.Client{Transport: transport.New(counted,
		transport.WithBucket(b),
		transport.WithKey(func(*http.Request) string { return cfg.Key }))}

	startAt, err := fleettest.Ready()
	if err != nil {
		fmt.Fprintln(os.Stderr, "limiters worker:", err)
		return 2
	}
	start = startAt
	time.Sleep(time.Until(start))
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(limitersCutoff))
	defer cancel()

	t := fleettest.Get(ctx, client, cfg.URL, cfg.Calls, cfg.Goroutines)
	res.OK, res.Lost, res.Err, res.Last = t.OK, t.Lost, t.Err, t.Last
	res.Attempts = attempts.Load()
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

// A limiter of TestFleetAgainstRealLimiters: one of llmtest's shapes, or a
// real proxy in front of an unlimited llmtest server.
const (
	fakeCounting = "llmtest counting window" // CountingSlidingWindow
	fakeLeaky    = "llmtest leaky bucket"    // LeakyBucket
	realHAProxy  = "haproxy"                 // stick table on http_req_rate(1s)
	realNginx    = "nginx"                   // limit_req burst nodelay
	// Token buckets that report themselves in OpenAI's headers (and a 429's
	// Retry-After, the wait in whole seconds): 600 a minute with a burst of
	// 600, and limitersRate a second with a burst of limitersRate.
	fakeOpenAIMinute = "llmtest OpenAI 600/min"
	fakeOpenAISecond = "llmtest OpenAI 20/s"
)

// limitersScenario is one run of TestFleetAgainstRealLimiters.
type limitersScenario struct {
	limiter    string
	retryAfter bool    // the limiter's 429s say Retry-After: 1
	rate       float64 // of sluice's bucket
	bucket     string  // sluice's bucket: a token bucket ("") or a recipe
	// calls in all, and the least makespan the tighter of the limiter and
	// sluice's bucket allows them; zero: limitersCalls and limitersIdeal.
	calls int
	ideal time.Duration
}

func (sc limitersScenario) name() string {
	ra := "no-retry-after"
	if sc.retryAfter {
		ra = "retry-after-1"
	}
	name := fmt.Sprintf("%s/%s/sluice-%g", strings.NewReplacer(" ", "-", "/", "-").Replace(sc.limiter), ra, sc.rate)
	if sc.bucket != "" {
		name += "-" + strings.ReplaceAll(sc.bucket, " ", "-")
	}
	return name
}

func (sc limitersScenario) callsInAll() int {
	if sc.calls == 0 {
		return limitersCalls
	}
	return sc.calls
}

func (sc limitersScenario) idealMakespan() time.Duration {
	if sc.ideal == 0 {
		return limitersIdeal
	}
	return sc.ideal
}

// limitersRun is what one scenario measured.
type limitersRun struct {
	ok, lost    int
	throttled   int   // 429s the workers got
	attempts    int64 // requests the workers sent
	makespan    time.Duration
	by429       []int   // by second, summed over the workers
	admitted    []int64 // requests the llmtest server behind the limiter answered, by second
	cuts        string  // sluice's decreases
	errs        []string
	limiterDesc string
}

// TestFleetAgainstRealLimiters measures sluice against the two shapes of
// limiter that issue "Learn the provider's real limit" names, which
// llmtest's TokenBucket, FixedWindow and SlidingWindow lack: a sliding
// window that counts refused requests too (haproxy's stick table on
// http_req_rate(1s), and OpenAI by its own account), and a leaky bucket
// that admits burst+1 at once and refuses the excess (nginx's limit_req
// burst=20 nodelay). Each is run as llmtest's CountingSlidingWindow and
// LeakyBucket and, where the binaries are installed, as the real haproxy
// and nginx reverse-proxying an unlimited llmtest server on loopback; all
// at 20 requests per second, their 429s with Retry-After: 1 or without
// any, against sluice's Redis bucket at the true limit
// (bucket.PerSecond(20)) and at twice it. Each scenario is
// limitersProcs processes of limitersGoroutines goroutines making
// limitersCalls calls in all, each process one http.Client through
// transport.New with the default options but the bucket and one key.
//
// It is a measurement, logged as a table: 429s per call, calls lost (whose
// final response is not 200, or an error: the default retries are 3
// attempts), makespan against the ideal. It asserts only that every
// scenario ran, and runs only with SLUICE_LIMITERS_FLEET=1; without nginx
// or haproxy it skips their scenarios, or fails with SLUICE_STRICT=1.
// Scenarios run as parallel subtests: -parallel sets how many at once.
func TestFleetAgainstRealLimiters(t *testing.T) {
	if os.Getenv("SLUICE_LIMITERS_FLEET") != "1" {
		t.Skip("a measurement of a minute or more: set SLUICE_LIMITERS_FLEET=1")
	}
	var scenarios []limitersScenario
	for _, limiter := range []string{fakeCounting, realHAProxy, fakeLeaky, realNginx} {
		for _, ra := range []bool{false, true} {
			for _, rate := range []float64{limitersRate, 2 * limitersRate} {
				scenarios = append(scenarios, limitersScenario{limiter: limiter, retryAfter: ra, rate: rate})
			}
		}
	}
	runLimitersTable(t, scenarios)
}

// TestFleetAgainstReportedQuotas measures sluice, as
// TestFleetAgainstRealLimiters does, against token buckets that report
// their quota in OpenAI's headers, which issue "Learn the provider's real
// limit" names: 600 calls against 600 a minute with a burst of 600, sluice
// at 20/s (its own limit the tighter: ideal 29 s) and at 100/s (ideal 5 s);
// and against 20/s with a burst of 20, sluice at 40/s with the default
// warm start (ideal 29 s). It is a measurement, logged as a table, and runs
// only with SLUICE_LIMITERS_FLEET=1.
func TestFleetAgainstReportedQuotas(t *testing.T) {
	if os.Getenv("SLUICE_LIMITERS_FLEET") != "1" {
		t.Skip("a measurement of half a minute or more: set SLUICE_LIMITERS_FLEET=1")
	}
	const calls = 600
	runLimitersTable(t, []limitersScenario{
		{limiter: fakeOpenAIMinute, rate: 20, calls: calls, ideal: (calls - 20) * time.Second / 20},
		{limiter: fakeOpenAIMinute, rate: 100, calls: calls, ideal: (calls - 100) * time.Second / 100},
		{limiter: fakeOpenAISecond, rate: 2 * limitersRate, calls: calls, ideal: (calls - limitersRate) * time.Second / limitersRate},
	})
}

// The recipes that the README gives for a provider that counts in a
// sliding window, or counts refused requests.
const (
	recipeColdStart  = "cold start"  // adaptive.Policy{ColdStart: true}
	recipeBurstOne   = "burst 1"     // bucket.Limit{Rate: n - 1, Burst: 1}: Burst + Rate·1 s = n
	recipeSlidingLog = "sliding log" // bucket.NewSlidingLog
)

// TestFleetLimiterRecipes measures, as TestFleetAgainstRealLimiters does,
// the README's recipes against the limiters that count over a sliding
// second, refusals included (llmtest's CountingSlidingWindow and haproxy),
// configured at the true limit: a token bucket that starts cold, one whose
// burst and a second's refill add up to the limit (a burst of 1), and a
// sliding log. It is a measurement, logged as a table, and runs only with
// SLUICE_LIMITERS_FLEET=1.
func TestFleetLimiterRecipes(t *testing.T) {
	if os.Getenv("SLUICE_LIMITERS_FLEET") != "1" {
		t.Skip("a measurement of half a minute or more: set SLUICE_LIMITERS_FLEET=1")
	}
	var scenarios []limitersScenario
	for _, limiter := range []string{fakeCounting, realHAProxy} {
		for _, ra := range []bool{false, true} {
			for _, recipe := range []string{recipeColdStart, recipeBurstOne, recipeSlidingLog} {
				scenarios = append(scenarios, limitersScenario{limiter: limiter, retryAfter: ra, rate: limitersRate, bucket: recipe})
			}
		}
	}
	runLimitersTable(t, scenarios)
}

// runLimitersTable runs scenarios as parallel subtests and logs their
// table.
func runLimitersTable(t *testing.T, scenarios []limitersScenario) {
	addr := redistest.Addr(t)
	runs := make([]*limitersRun, len(scenarios))
	began := time.Now()
	t.Run("scenarios", func(t *testing.T) {
		for i, sc := range scenarios {
			t.Run(sc.name(), func(t *testing.T) {
				t.Parallel()
				r := runLimitersFleet(t, addr, sc)
				runs[i] = r
				t.Logf("%s: 429s by second: %v\nadmitted by second: %v\ndecreases (time: fraction of the ceiling): %s\nerrors: %v",
					r.limiterDesc, r.by429, r.admitted, r.cuts, r.errs)
				assert.Equal(t, sc.callsInAll(), r.ok+r.lost, "every call is accounted for")
			})
		}
	})
	wall := time.Since(began)

	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%d processes x %d goroutines; the ideal makespan is the least the tighter of the limiter and sluice's bucket allows; wall time %.1fs\n",
		limitersProcs, limitersGoroutines, wall.Seconds())
	fmt.Fprintf(&sb, "%-26s %-13s %-16s %5s %4s %5s %6s %8s %5s %8s %9s %7s\n",
		"limiter", "Retry-After", "sluice", "calls", "ok", "lost", "429s", "429 %", "sent", "ideal", "makespan", "x ideal")
	for i, sc := range scenarios {
		r := runs[i]
		if r == nil {
			continue
		}
		ra := "none"
		switch {
		case sc.retryAfter:
			ra = "1"
		case sc.limiter == fakeOpenAIMinute || sc.limiter == fakeOpenAISecond:
			ra = "the wait"
		}
		n, ideal := sc.callsInAll(), sc.idealMakespan()
		fmt.Fprintf(&sb, "%-26s %-13s %-16s %5d %4d %5d %6d %7.1f%% %5d %7.0fs %8.2fs %7.2f\n",
			sc.limiter, ra, strings.TrimSpace(fmt.Sprintf("%g/s %s", sc.rate, sc.bucket)), n, r.ok, r.lost, r.throttled,
			100*float64(r.throttled)/float64(n), r.attempts, ideal.Seconds(), r.makespan.Seconds(), r.makespan.Seconds()/ideal.Seconds())
	}
	t.Log(sb.String())
}

// runLimitersFleet runs sc's limiter and worker processes and returns what
// they measured; it skips (fails, if strict) when sc's proxy is not
// installed.
func runLimitersFleet(t *testing.T, addr string, sc limitersScenario) *limitersRun {
	run := &limitersRun{}
	var srv *llmtest.Server
	url := ""
	switch sc.limiter {
	case fakeCounting, fakeLeaky:
		cfg := llmtest.Config{Requests: llmtest.CountingSlidingWindow(limitersRate, time.Second), RetryAfter: -1}
		if sc.limiter == fakeLeaky {
			cfg.Requests = llmtest.LeakyBucket(limitersRate, time.Second, limitersRate)
		}
		if sc.retryAfter {
			cfg.RetryAfter = time.Second
		}
		srv = llmtest.NewServer(cfg)
		t.Cleanup(srv.Close)
		url = srv.URL + "/ping"
		run.limiterDesc = cfg.Requests.String()
	case fakeOpenAIMinute, fakeOpenAISecond:
		cfg := llmtest.Config{Requests: llmtest.TokenBucket(600, time.Minute, 600), Headers: llmtest.OpenAIHeaders}
		if sc.limiter == fakeOpenAISecond {
			cfg.Requests = llmtest.TokenBucket(limitersRate, time.Second, limitersRate)
		}
		srv = llmtest.NewServer(cfg)
		t.Cleanup(srv.Close)
		url = srv.URL + "/ping"
		run.limiterDesc = cfg.Requests.String() + ", OpenAI headers"
	case realHAProxy, realNginx:
		srv = llmtest.NewServer(llmtest.Config{})
		t.Cleanup(srv.Close)
		upstream := strings.TrimSuffix(strings.TrimPrefix(srv.URL, "http://"), "/v1")
		port := startProxy(t, sc.limiter, upstream, sc.retryAfter)
		url = fmt.Sprintf("http://127.0.0.1:%d/v1/ping", port)
		run.limiterDesc = fmt.Sprintf("%s on 127.0.0.1:%d in front of llmtest on %s", sc.limiter, port, upstream)
	}

	ctx, cancel := context.WithTimeout(context.Background(), limitersCutoff+30*time.Second)
	defer cancel()
	var procs []*fleettest.Worker
	defer func() {
		cancel() // kills the workers still running
		for _, p := range procs {
			p.Wait() // a no-op once waited for
		}
	}()
	key := fmt.Sprintf("limiters-%s-%d", sc.name(), time.Now().UnixNano())
	share := sc.callsInAll() / limitersProcs
	for i := range limitersProcs {
		calls := share
		if i == 0 {
			calls += sc.callsInAll() - share*limitersProcs
		}
		p, err := fleettest.Start(ctx, limitersWorkerEnv, limitersWorkerConfig{Redis: addr, Key: key, URL: url,
			Calls: calls, Goroutines: limitersGoroutines, Rate: sc.rate, Bucket: sc.bucket})
		require.NoError(t, err)
		procs = append(procs, p)
	}
	require.NoError(t, fleettest.AwaitReady(procs))
	srv.Reset() // counters and Series from about the start
	start := time.Now().Add(100 * time.Millisecond)
	cuts := fleettest.WatchDecreases(ctx, addr, "sluice:{"+key+"}", start)
	require.NoError(t, fleettest.Release(procs, start))
	var last int64
	for i, p := range procs {
		var r limitersResult
		require.NoError(t, p.Report(i, &r))
		if r.Err != "" {
			run.errs = append(run.errs, fmt.Sprintf("worker %d: %s", i+1, r.Err))
		}
		run.ok += r.OK
		run.lost += r.Lost
		run.attempts += r.Attempts
		for s, n := range r.By429 {
			for len(run.by429) <= s {
				run.by429 = append(run.by429, 0)
			}
			run.by429[s] += n
			run.throttled += n
		}
		last = max(last, r.Last)
	}
	run.makespan = time.Unix(0, last).Sub(start)
	run.cuts = cuts()
	for _, pt := range srv.Series(time.Second) {
		run.admitted = append(run.admitted, pt.Requests)
	}
	return run
}

// startProxy starts the real limiter kind (realHAProxy or realNginx) in
// the foreground on a free loopback port, proxying to upstream (host:port)
// at limitersRate requests per second, its 429s with Retry-After: 1 if
// retryAfter; it returns the port once the proxy accepts connections, and
// stops the proxy when t is done. It skips t if the binary is not
// installed, or fails it with SLUICE_STRICT=1.
func startProxy(t *testing.T, kind, upstream string, retryAfter bool) int {
	bin, err := lookBin(kind)
	if err != nil {
		if redistest.Strict() {
			t.Fatalf("%s required (SLUICE_STRICT=1) but not installed: %v", kind, err)
		}
		t.Skipf("%s not installed: %v", kind, err)
	}
	port, err := freeLoopbackPort()
	require.NoError(t, err)
	dir := t.TempDir()
	conf := filepath.Join(dir, kind+".conf")
	var args []string
	switch kind {
	case realNginx:
		// master_process off: one process, in the foreground, as the
		// user running the test; every path under dir.
		ra := ""
		if retryAfter {
			ra = "1"
		}
		cfg := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 1024; }
http {
	access_log off;
	client_body_temp_path %[1]s/client_body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	limit_req_zone $binary_remote_addr zone=llm:1m rate=%[2]dr/s;
	limit_req_status 429;
	# Retry-After on the 429s only: add_header skips an empty value.
	map $status $retry_after { 429 "%[3]s"; default ""; }
	upstream llm { server %[4]s; keepalive 64; }
	server {
		listen 127.0.0.1:%[5]d;
		location / {
			limit_req zone=llm burst=%[2]d nodelay;
			add_header Retry-After $retry_after always;
			proxy_pass http://llm;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
		}
	}
}
`, dir, limitersRate, ra, upstream, port)
		require.NoError(t, os.WriteFile(conf, []byte(cfg), 0o600))
		args = []string{"-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", conf}
	case realHAProxy:
		hdr := ""
		if retryAfter {
			hdr = " hdr Retry-After 1"
		}
		// track-sc0 counts every request in http_req_rate, the denied
		// ones too, before the deny reads it.
		cfg := fmt.Sprintf(`global
	maxconn 1024
defaults
	mode http
	timeout connect 5s
	timeout client 60s
	timeout server 60s
frontend llm
	bind 127.0.0.1:%[1]d
	stick-table type ip size 100 expire 60s store http_req_rate(1s)
	http-request track-sc0 src
	http-request deny deny_status 429%[2]s if { sc_http_req_rate(0) gt %[3]d }
	default_backend llm
backend llm
	server upstream %[4]s
`, port, hdr, limitersRate, upstream)
		require.NoError(t, os.WriteFile(conf, []byte(cfg), 0o600))
		require.NoError(t, exec.Command(bin, "-c", "-q", "-f", conf).Run(), "haproxy -c %s", conf)
		args = []string{"-db", "-f", conf}
	}
	cmd := exec.Command(bin, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	// Ready when it accepts a connection; a request would count.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 100*time.Millisecond)
		if err == nil {
			c.Close()
			return port
		}
		select {
		case <-exited:
			t.Fatalf("%s exited: %s", kind, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not listening on %d: %v: %s", kind, port, err, out.String())
		}
	}
}

// lookBin finds the binary of kind on PATH or in /usr/sbin, where Debian
// puts nginx and haproxy.
func lookBin(kind string) (string, error) {
	if p, err := exec.LookPath(kind); err == nil {
		return p, nil
	}
	p := filepath.Join("/usr/sbin", kind)
	if _, err := os.Stat(p); err != nil {
		return "", errors.New(kind + " is neither on PATH nor in /usr/sbin")
	}
	return p, nil
}

// freeLoopbackPort returns a TCP port free on 127.0.0.1 a moment ago.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
