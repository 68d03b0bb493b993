// Llmfleet is sluice's showcase: a fleet of processes that call an
// OpenAI-compatible chat API through llmclient, sharing one requests and
// tokens quota in Redis, and keep to the API's limit as one client would.
//
// By default llmfleet starts a fake API in-process (llmclient/llmtest)
// with a hidden limit of -rpm requests and -tpm tokens per minute, each a
// token bucket that holds 2 seconds of its rate (providers enforce their
// per-minute limits over shorter periods), answering 429 with Retry-After
// beyond it and reporting its quota in OpenAI's x-ratelimit-* headers. Like
// OpenAI, it charges a call its prompt plus its max_tokens at admission;
// its completions run to their max_tokens (unless -reply-tokens stops them
// sooner), so that the usage they report is what they were charged. The
// tokens limit is the binding one: the calls' average size makes -tpm run
// out before -rpm does. With -base-url llmfleet calls that API instead,
// with -api-key (default $OPENAI_API_KEY) and -model; -rpm and -tpm should
// then be the account's limits.
//
// The parent process starts -procs copies of itself, each making its share
// of -jobs chat calls with -workers goroutines, through an
// llmclient.Client whose bucket is a bucket.NewRedis of -rpm and -tpm (with
// a burst of -burst at those rates), all on the same Redis key: the API's
// host and a hash of the API key. Each call is charged its estimated
// tokens (prompt and max_tokens) before it is sent, and reconciled with
// the usage its response reports. The prompts are of varied length (20 to
// 800 tokens, max_tokens 32 to 256), pseudo-random from -seed. With no
// -redis flag the parent serves an embedded Redis (miniredis) for the
// duration of the run; with -redis it uses that server:
// redis://[user:password@]host:port[/db] (rediss:// for TLS), or
// host:port.
//
// While the fleet runs, a progress bar is drawn on stderr if it is a
// terminal; otherwise a progress line is written every 5 seconds. Then
// llmfleet prints:
//
//	llmfleet: 360 chat calls by 4 processes × 8 goroutines sharing one bucket in an embedded Redis
//	limit:    1,500 RPM, 600,000 TPM (the fake API's hidden limit)
//	ok:       360
//	failed:   0
//	429s:     0 of 360 requests the API answered (0.00%)
//	calls/s:  17.9 (limit 25.0: 71.5%)
//	tokens/s: 10,279 (limit 10,000: 102.8%; 99.9% from 2 s to 19 s)
//	makespan: 20.13 s (ideal 18.69 s: +7.7%)
//	usage:    bucket 206,884 tokens, API 206,884 (+0.00%)
//	chart:    llmfleet.png
//
// The counts are the fake API's own (with -base-url, what the workers
// saw): calls that succeeded, calls that failed after sluice's retries,
// and the 429s among all the requests the API answered, retries included.
// Rates are per second of makespan, from the fleet's common start to the
// last answer, and the tokens are those the API's usage reports; the
// tokens rate in the seconds after the start-up (the bucket's burst) and
// before the end is given as well. The ideal makespan is the least time in
// which the hidden limit, starting full, admits every request and token
// of the run (with -base-url, the least at -rpm and -tpm, without burst).
// The usage line holds the tokens the bucket was charged, net of
// reconciliation, against the usage the API counted.
//
// The chart (-chart: a .png or .svg file; empty for none) shows the tokens
// and the requests the API admitted in each second of the run, and the
// 429s, against the limit's rates (with -base-url: the calls that
// succeeded, by the second in which they were sent).
//
// Usage:
//
//	go run ./examples/llmfleet [flags]
//
// Flags:
//
//	-procs         worker processes (default 4)
//	-workers       goroutines per process (default 8)
//	-jobs          chat calls in all (default 360)
//	-rpm           requests per minute: the hidden limit, and the bucket's (default 1500)
//	-tpm           tokens per minute: the hidden limit, and the bucket's (default 600000)
//	-burst         the bucket's burst, as time at the limits' rates (default 1s)
//	-seed          seed of the prompts (default 1)
//	-base-url      an OpenAI-compatible API's base URL; empty starts a fake one (default "")
//	-api-key       its API key (default $OPENAI_API_KEY)
//	-model         the model to ask (default "gpt-4.1-mini")
//	-redis         Redis URL or host:port; empty serves an embedded Redis (default "")
//	-chart         file to draw the chart in, .png or .svg; empty for none (default "llmfleet.png")
//	-reply-tokens  the fake API's completions stop after this many tokens;
//	               0: each runs to its max_tokens (default 0)
//	-metrics       host:port on which worker 1 serves its bucket's and
//	               transport's metrics for Prometheus at /metrics while it
//	               runs, worker k on port+k-1 (examples/observability has a
//	               Grafana dashboard of them); empty: none (default "")
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/examples/internal/demo"
	"github.com/sluicehq/sluice/llmclient/llmtest"
)

const (
	// startDelay is how far ahead the parent sets the fleet's common
	// start, so that every worker is running and connected by then.
	startDelay = time.Second
	// redisTimeout bounds the workers' first call to Redis.
	redisTimeout = 5 * time.Second
	// hiddenBurst is how much of its rate each hidden limit of the fake
	// API holds.
	hiddenBurst = 2 * time.Second
	// The fake API's latency: a call takes fakeLatency, plus
	// fakeTokenLatency per completion token.
	fakeLatency      = 100 * time.Millisecond
	fakeTokenLatency = 2 * time.Millisecond
	// fakeKey is the API key given to the fake API.
	fakeKey = "sk-llmfleet"
)

func main() {
	// Every Redis error reaches the user through a returned error; the
	// client's own log lines would only repeat them.
	redis.SetLogger(demo.QuietLogger{})
	if spec, ok := os.LookupEnv(workerEnv); ok {
		os.Exit(workerMain(spec))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		os.Exit(2) // the flag package has printed the problem and the usage
	default:
		fmt.Fprintln(os.Stderr, "llmfleet:", err)
		os.Exit(1)
	}
}

// config is what the command line asks for.
type config struct {
	procs, workers, jobs int
	rpm, tpm             int
	burst                time.Duration
	seed                 uint64
	baseURL, apiKey      string
	model                string
	redis                string
	chart                string
	replyTokens          int
	metrics              string // host:port of the first worker's metrics; "": none
	metricsHost          string
	metricsPort          int
}

// errUsage reports command-line errors, already printed with the usage.
var errUsage = errors.New("usage error")

// parseFlags parses and checks args. Problems are written to stderr with the
// usage and reported as errUsage (or flag.ErrHelp for -h).
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("llmfleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: llmfleet [flags]\n\n"+
			"Worker processes make chat calls through sluice, sharing one requests and\n"+
			"tokens bucket in Redis, against a fake rate-limited API (or -base-url);\n"+
			"prints what got through against the limit and draws a chart of it.\n\nFlags:")
		fs.PrintDefaults()
	}
	fs.IntVar(&c.procs, "procs", 4, "number of worker processes")
	fs.IntVar(&c.workers, "workers", 8, "goroutines per worker process")
	fs.IntVar(&c.jobs, "jobs", 360, "chat calls in all")
	fs.IntVar(&c.rpm, "rpm", 1500, "requests per minute: the fake API's hidden limit, and the bucket's")
	fs.IntVar(&c.tpm, "tpm", 600_000, "tokens per minute: the fake API's hidden limit, and the bucket's")
	fs.DurationVar(&c.burst, "burst", time.Second, "the bucket's burst, as time at the limits' rates")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the prompts")
	fs.StringVar(&c.baseURL, "base-url", "", "an OpenAI-compatible API's base `URL`; empty starts a fake one")
	fs.StringVar(&c.apiKey, "api-key", "", "its API key (default $OPENAI_API_KEY)")
	fs.StringVar(&c.model, "model", "gpt-4.1-mini", "the model to ask")
	fs.StringVar(&c.redis, "redis", "", "Redis `URL` (redis://host:port, or host:port); empty serves an embedded Redis")
	fs.StringVar(&c.chart, "chart", "llmfleet.png", "`file` to draw the chart in, .png or .svg; empty for none")
	fs.IntVar(&c.replyTokens, "reply-tokens", 0, "the fake API's completions stop after this many tokens; 0: each runs to its max_tokens")
	fs.StringVar(&c.metrics, "metrics", "", "`host:port` on which worker 1 serves its metrics for Prometheus at /metrics, worker k on port+k-1; empty: none")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, errUsage // already printed by fs
	}
	var problem string
	switch ext := strings.ToLower(filepath.Ext(c.chart)); {
	case fs.NArg() > 0:
		problem = fmt.Sprintf("unexpected argument %q", fs.Arg(0))
	case c.procs < 1:
		problem = fmt.Sprintf("-procs must be >= 1, got %d", c.procs)
	case c.workers < 1:
		problem = fmt.Sprintf("-workers must be >= 1, got %d", c.workers)
	case c.jobs < 1:
		problem = fmt.Sprintf("-jobs must be >= 1, got %d", c.jobs)
	case c.rpm < 1:
		problem = fmt.Sprintf("-rpm must be >= 1, got %d", c.rpm)
	case c.tpm < 1:
		problem = fmt.Sprintf("-tpm must be >= 1, got %d", c.tpm)
	case c.burst <= 0:
		problem = fmt.Sprintf("-burst must be > 0, got %v", c.burst)
	case c.replyTokens < 0:
		problem = fmt.Sprintf("-reply-tokens must be >= 0, got %d", c.replyTokens)
	case c.chart != "" && ext != ".png" && ext != ".svg":
		problem = fmt.Sprintf("-chart must name a .png or .svg file, got %q", c.chart)
	}
	if problem == "" && c.baseURL != "" {
		u, err := url.Parse(c.baseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			problem = fmt.Sprintf("-base-url must be an http or https URL, got %q", c.baseURL)
		}
		if c.apiKey == "" {
			c.apiKey = os.Getenv("OPENAI_API_KEY")
		}
	}
	if problem == "" && c.metrics != "" {
		host, port, err := net.SplitHostPort(c.metrics)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil || n < 1 || n+c.procs-1 > 65535 {
			problem = fmt.Sprintf("-metrics must be host:port with room for %d ports from port, got %q", c.procs, c.metrics)
		}
		c.metricsHost, c.metricsPort = host, n
	}
	if problem == "" && c.redis != "" {
		u, err := demo.RedisURL(c.redis)
		if err != nil {
			problem = "-redis: " + err.Error()
		}
		c.redis = u
	}
	if problem != "" {
		fmt.Fprintln(stderr, "llmfleet:", problem)
		fs.Usage()
		return c, errUsage
	}
	return c, nil
}

// run is the parent: it starts the fake API and Redis if need be, then the
// workers, follows their progress and prints the summary.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}

	redisName := "Redis at " + demo.Redacted(c.redis)
	if c.redis == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return fmt.Errorf("start embedded Redis: %w", err)
		}
		defer mr.Close()
		c.redis = "redis://" + mr.Addr()
		redisName = "an embedded Redis"
	} else if err := demo.Ping(ctx, c.redis, redisTimeout); err != nil {
		return fmt.Errorf("cannot reach Redis at %s: %w", demo.Redacted(c.redis), err)
	}

	var api *llmtest.Server
	if c.baseURL == "" {
		reply := c.replyTokens
		if reply == 0 {
			// Every completion runs to its max_tokens, so that what the
			// API charges at admission is what its usage reports.
			reply = maxCompletion
		}
		api = llmtest.NewServer(llmtest.Config{
			Requests:     llmtest.TokenBucket(int64(c.rpm), time.Minute, burstOf(c.rpm)),
			Tokens:       llmtest.TokenBucket(int64(c.tpm), time.Minute, burstOf(c.tpm)),
			Headers:      llmtest.OpenAIHeaders,
			RetryAfterMs: true,
			ReplyTokens:  reply,
			Latency:      fakeLatency,
			TokenLatency: fakeTokenLatency,
		})
		defer api.Close()
		c.baseURL, c.apiKey = api.URL, fakeKey
	}

	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable to start workers: %w", err)
	}

	// The fake API's Series counts in seconds from its Reset: from one
	// second exactly before the start.
	if api != nil {
		api.Reset()
	}
	start := time.Now().Add(startDelay)

	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // kills the workers still running
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		res      = &results{}
		bar      = newProgress(stderr, c.jobs, start)
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	for i := range c.procs {
		spec := workerSpec{
			ID: i, Procs: c.procs, Workers: c.workers, Jobs: c.jobs, Seed: c.seed,
			BaseURL: c.baseURL, APIKey: c.apiKey, Model: c.model, Redis: c.redis,
			RPM: float64(c.rpm), TPM: float64(c.tpm), Burst: c.burst,
			Start: start.UnixNano(),
		}
		if c.metrics != "" {
			spec.Metrics = net.JoinHostPort(c.metricsHost, strconv.Itoa(c.metricsPort+i))
			fmt.Fprintf(stdout, "metrics:  worker %d at http://%s/metrics while it runs\n", i+1, spec.Metrics)
		}
		w, err := startWorker(ctx, exe, spec)
		if err != nil {
			fail(err)
			break
		}
		wg.Go(func() {
			if err := w.follow(res, bar); err != nil {
				fail(err)
			}
		})
	}
	wg.Wait()
	bar.close()

	if parent.Err() != nil {
		return errors.New("interrupted")
	}
	if firstErr != nil {
		return firstErr
	}

	s := summarize(c, res, api, start)
	s.redis = redisName
	if c.chart != "" {
		if err := writeChart(c.chart, s.chart); err != nil {
			return fmt.Errorf("write the chart: %w", err)
		}
	}
	s.print(stdout, c.chart)
	return nil
}

// burstOf returns what a hidden limit of n per minute holds: hiddenBurst
// of its rate.
func burstOf(n int) int64 {
	return max(1, int64(math.Round(float64(n)*hiddenBurst.Seconds()/60)))
}

// results gathers what the workers report.
type results struct {
	mu        sync.Mutex
	ok        int
	failed    int
	tokens    int64 // usage the successful calls reported
	end       int64 // unix ns of the last call's return
	jobs      []jobResult
	errs      map[string]int // failed calls by error
	ledger    float64
	attempts  int64
	throttled int64
}

func (r *results) addJob(j jobResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if j.Err != "" {
		r.failed++
		if r.errs == nil {
			r.errs = make(map[string]int)
		}
		r.errs[j.Err]++
	} else {
		r.ok++
		r.tokens += int64(j.Tokens)
	}
	r.end = max(r.end, j.End)
	r.throttled += int64(len(j.Throttled))
	r.jobs = append(r.jobs, j)
}

func (r *results) addTotals(t totals) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ledger += t.Ledger
	r.attempts += t.Attempts
}

// worker is a running worker process.
type worker struct {
	id     int
	cmd    *exec.Cmd
	stdout io.Reader
	stderr *bytes.Buffer
}

// startWorker starts a copy of this executable as worker spec.ID. It is
// killed if ctx is done before it exits.
func startWorker(ctx context.Context, exe string, spec workerSpec) (*worker, error) {
	js, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), workerEnv+"="+string(js))
	cmd.WaitDelay = time.Second
	w := &worker{id: spec.ID + 1, cmd: cmd, stderr: new(bytes.Buffer)}
	cmd.Stderr = w.stderr
	if w.stdout, err = cmd.StdoutPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker %d: %w", w.id, err)
	}
	return w, nil
}

// maxLine bounds a line of a worker's output.
const maxLine = 1 << 20

// follow reads the worker's messages into res as they come, counting the
// calls on bar, and waits for it to exit.
func (w *worker) follow(res *results, bar *progress) error {
	var (
		done   bool
		badErr error
	)
	sc := bufio.NewScanner(w.stdout)
	sc.Buffer(nil, maxLine)
	for sc.Scan() {
		var m message
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil || (m.Job == nil && m.Done == nil) {
			if badErr == nil {
				badErr = fmt.Errorf("unexpected output %q", sc.Text())
			}
			continue
		}
		if m.Job != nil {
			res.addJob(*m.Job)
			bar.add(m.Job.Err == "", m.Job.Tokens)
		}
		if m.Done != nil {
			res.addTotals(*m.Done)
			done = true
		}
	}
	scanErr := sc.Err()
	err := w.cmd.Wait()
	switch {
	case err != nil:
		if msg := strings.TrimSpace(w.stderr.String()); msg != "" {
			return fmt.Errorf("worker %d failed (%v): %s", w.id, err, msg)
		}
		return fmt.Errorf("worker %d failed: %w", w.id, err)
	case scanErr != nil:
		return fmt.Errorf("worker %d: reading its output: %w", w.id, scanErr)
	case badErr != nil:
		return fmt.Errorf("worker %d: %w", w.id, badErr)
	case !done:
		return fmt.Errorf("worker %d exited without reporting its totals", w.id)
	}
	return nil
}
