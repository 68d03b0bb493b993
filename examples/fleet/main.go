// Fleet shows several processes sharing one quota through sluice's
// Redis token bucket.
//
// The parent process starts -workers copies of itself. Every worker charges
// the same bucket key: a token bucket of -capacity tokens that refills at
// -rate tokens per second, kept in Redis. Each worker sends -requests
// requests, one every -interval, all workers starting at the same instant,
// and asks the bucket for one token per request without waiting for one.
// Each answer is printed as it happens:
//
//	[worker 2] 07 allowed=true
//
// then how many requests each worker got through and, for the whole fleet:
//
//	worker 1: allowed=6
//	worker 2: allowed=9
//	worker 3: allowed=9
//	total allowed: 24
//	elapsed: 2.90 s
//	bound: 24.5
//
// elapsed runs from the common start to the moment the last request was
// answered, and bound = capacity + rate × elapsed is the most that any token
// bucket of that shape may admit in that time. However the requests of the
// workers interleave, the total stays within the bound, and because the
// workers together ask for more than the bucket allows, it comes close to
// it. The command exits with status 1 if the total ever exceeds the bound.
//
// With no -redis flag, fleet serves an embedded Redis (miniredis) on
// 127.0.0.1 for the duration of the run, so the demo needs no setup. With
// -redis it uses that server instead: redis://[user:password@]host:port[/db]
// (or rediss:// for TLS), or simply host:port. Every run uses a key of its
// own, so runs never share tokens.
//
// Usage:
//
//	go run ./examples/fleet [flags]
//
// Flags:
//
//	-workers   worker processes (default 3)
//	-requests  requests per worker (default 30)
//	-interval  time between a worker's requests (default 100ms)
//	-capacity  bucket capacity, the burst (default 10)
//	-rate      refill rate, tokens per second (default 5)
//	-redis     Redis URL or host:port; empty serves an embedded Redis (default "")
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
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/examples/internal/demo"
)

// workerEnv, when set, makes the process a worker; its value is the worker's
// JSON-encoded workerSpec.
const workerEnv = "SLUICE_FLEET_WORKER"

// resultPrefix starts the last line a worker writes, which its parent reads
// instead of printing: "fleet-result: allowed=<n> end=<unix nanoseconds>".
const resultPrefix = "fleet-result:"

const (
	// startDelay is how far ahead the parent sets the common start, so that
	// every worker is running and connected by then.
	startDelay = 500 * time.Millisecond
	// redisTimeout bounds each call to Redis.
	redisTimeout = 5 * time.Second
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
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

// config is what the command line asks for.
type config struct {
	workers  int
	requests int
	interval time.Duration
	capacity float64
	rate     float64
	redis    string
}

// errUsage reports command-line errors, already printed with the usage.
var errUsage = errors.New("usage error")

// parseFlags parses and checks args. Problems are written to stderr with the
// usage and reported as errUsage (or flag.ErrHelp for -h).
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: fleet [flags]\n\n"+
			"Worker processes share one Redis token bucket; prints what each request\n"+
			"got and the total against the bound capacity + rate × elapsed.\n\nFlags:")
		fs.PrintDefaults()
	}
	fs.IntVar(&c.workers, "workers", 3, "number of worker processes")
	fs.IntVar(&c.requests, "requests", 30, "requests per worker")
	fs.DurationVar(&c.interval, "interval", 100*time.Millisecond, "time between a worker's requests")
	fs.Float64Var(&c.capacity, "capacity", 10, "bucket capacity (burst), in tokens")
	fs.Float64Var(&c.rate, "rate", 5, "bucket refill rate, in tokens per second")
	fs.StringVar(&c.redis, "redis", "", "Redis `URL` (redis://host:port, or host:port); empty serves an embedded Redis")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, errUsage // already printed by fs
	}
	var problem string
	switch {
	case fs.NArg() > 0:
		problem = fmt.Sprintf("unexpected argument %q", fs.Arg(0))
	case c.workers < 1:
		problem = fmt.Sprintf("-workers must be >= 1, got %d", c.workers)
	case c.requests < 1:
		problem = fmt.Sprintf("-requests must be >= 1, got %d", c.requests)
	case c.interval <= 0:
		problem = fmt.Sprintf("-interval must be > 0, got %v", c.interval)
	case !(c.capacity > 0) || math.IsInf(c.capacity, 0):
		problem = fmt.Sprintf("-capacity must be a number > 0, got %g", c.capacity)
	case !(c.rate > 0) || math.IsInf(c.rate, 0):
		problem = fmt.Sprintf("-rate must be a number > 0, got %g", c.rate)
	}
	if problem == "" && c.redis != "" {
		u, err := demo.RedisURL(c.redis)
		if err != nil {
			problem = "-redis: " + err.Error()
		}
		c.redis = u
	}
	if problem != "" {
		fmt.Fprintln(stderr, "fleet:", problem)
		fs.Usage()
		return c, errUsage
	}
	return c, nil
}

// run is the parent: it starts the workers, relays their output and prints
// the totals.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}

	if c.redis == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return fmt.Errorf("start embedded Redis: %w", err)
		}
		defer mr.Close()
		c.redis = "redis://" + mr.Addr()
	} else if err := demo.Ping(ctx, c.redis, redisTimeout); err != nil {
		return fmt.Errorf("cannot reach Redis at %s: %w", demo.Redacted(c.redis), err)
	}

	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable to start workers: %w", err)
	}

	key := fmt.Sprintf("fleet-demo-%d", time.Now().UnixNano())
	start := time.Now().Add(startDelay)
	out := &syncWriter{w: stdout}

	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // kills the workers still running
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		results  = make([]result, c.workers)
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	for i := range c.workers {
		spec := workerSpec{
			ID:       i + 1,
			Redis:    c.redis,
			Key:      key,
			Start:    start.UnixNano(),
			Requests: c.requests,
			Interval: c.interval,
			Capacity: c.capacity,
			Rate:     c.rate,
		}
		w, err := startWorker(ctx, exe, spec)
		if err != nil {
			fail(err)
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := w.follow(out)
			if err != nil {
				fail(err)
				return
			}
			results[i] = res
		}()
	}
	wg.Wait()

	if parent.Err() != nil {
		return errors.New("interrupted")
	}
	if firstErr != nil {
		return firstErr
	}

	total, end := 0, start
	for i, r := range results {
		out.printf("worker %d: allowed=%d\n", i+1, r.allowed)
		total += r.allowed
		if r.end.After(end) {
			end = r.end
		}
	}
	elapsed := end.Sub(start).Seconds()
	bound := c.capacity + c.rate*elapsed
	out.printf("total allowed: %d\n", total)
	out.printf("elapsed: %.2f s\n", elapsed)
	out.printf("bound: %.1f\n", bound)
	if float64(total) > bound {
		return fmt.Errorf("total allowed %d exceeds the bound %.2f: the bucket admitted too much", total, bound)
	}
	return nil
}

// syncWriter writes whole lines to w, one writer at a time.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) printf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.w, format, args...)
}

// workerSpec is what a worker is told to do, passed in workerEnv.
type workerSpec struct {
	ID       int           `json:"id"`
	Redis    string        `json:"redis"` // URL
	Key      string        `json:"key"`
	Start    int64         `json:"start"` // unix nanoseconds
	Requests int           `json:"requests"`
	Interval time.Duration `json:"interval"`
	Capacity float64       `json:"capacity"`
	Rate     float64       `json:"rate"`
}

// result is what a worker reports at the end.
type result struct {
	allowed int
	end     time.Time // when its last request was answered
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
	w := &worker{id: spec.ID, cmd: cmd, stderr: new(bytes.Buffer)}
	cmd.Stderr = w.stderr
	if w.stdout, err = cmd.StdoutPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker %d: %w", spec.ID, err)
	}
	return w, nil
}

// follow copies the worker's output lines to out as they come, waits for
// it to exit and returns its result.
func (w *worker) follow(out *syncWriter) (result, error) {
	var (
		res    result
		got    bool
		badErr error
	)
	sc := bufio.NewScanner(w.stdout)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, resultPrefix); ok {
			res, badErr = parseResult(rest)
			got = badErr == nil
			continue
		}
		out.printf("%s\n", line)
	}
	scanErr := sc.Err()
	err := w.cmd.Wait()
	switch {
	case err != nil:
		if msg := strings.TrimSpace(w.stderr.String()); msg != "" {
			return res, fmt.Errorf("worker %d failed (%v): %s", w.id, err, msg)
		}
		return res, fmt.Errorf("worker %d failed: %w", w.id, err)
	case scanErr != nil:
		return res, fmt.Errorf("worker %d: reading its output: %w", w.id, scanErr)
	case badErr != nil:
		return res, fmt.Errorf("worker %d: bad result line: %w", w.id, badErr)
	case !got:
		return res, fmt.Errorf("worker %d exited without reporting its result", w.id)
	}
	return res, nil
}

// parseResult parses what follows resultPrefix: " allowed=<n> end=<ns>".
func parseResult(s string) (result, error) {
	var allowed int
	var end int64
	if _, err := fmt.Sscanf(s, " allowed=%d end=%d", &allowed, &end); err != nil {
		return result{}, fmt.Errorf("%q: %w", s, err)
	}
	return result{allowed: allowed, end: time.Unix(0, end)}, nil
}

// workerMain runs a worker process and returns its exit status.
func workerMain(specJSON string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var spec workerSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "fleet worker: bad %s: %v\n", workerEnv, err)
		return 1
	}
	if err := work(ctx, spec, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "fleet worker %d: %v\n", spec.ID, err)
		return 1
	}
	return 0
}

// work sends spec.Requests requests through the shared bucket, the i-th at
// spec.Start + i×spec.Interval, writing a line to w for each and a result
// line at the end.
func work(ctx context.Context, spec workerSpec, w io.Writer) error {
	opt, err := redis.ParseURL(spec.Redis)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	limit := bucket.Limit{Rate: spec.Rate, Burst: spec.Capacity}
	if err := limit.Validate(); err != nil {
		return err
	}
	b := bucket.NewRedis(rdb, limit)

	// Connect, and have the bucket load its scripts (a read of the key,
	// which changes nothing), before the start, so that the first request
	// is not late: on a loaded machine the first call of a bucket took
	// 300 ms against the embedded Redis, while the key's refill counted
	// from the start.
	pctx, cancel := context.WithTimeout(ctx, redisTimeout)
	err = rdb.Ping(pctx).Err()
	if err == nil {
		_, err = b.Tokens(pctx, spec.Key)
	}
	cancel()
	if err != nil {
		return fmt.Errorf("cannot reach Redis at %s: %w", demo.Redacted(spec.Redis), err)
	}

	start := time.Unix(0, spec.Start)
	allowed, end := 0, start
	for i := range spec.Requests {
		if err := demo.SleepUntil(ctx, start.Add(time.Duration(i)*spec.Interval)); err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, redisTimeout)
		r, err := b.Reserve(rctx, spec.Key, bucket.N(1), 0)
		cancel()
		end = time.Now()
		if err != nil {
			return fmt.Errorf("request %d: %w", i+1, err)
		}
		if r.OK {
			allowed++
		}
		if _, err := fmt.Fprintf(w, "[worker %d] %02d allowed=%t\n", spec.ID, i+1, r.OK); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(w, "%s allowed=%d end=%s\n", resultPrefix, allowed, strconv.FormatInt(end.UnixNano(), 10))
	return err
}
