package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/examples/internal/demo"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/transport"
)

// workerEnv, when set, makes the process a worker; its value is the
// worker's JSON-encoded workerSpec.
const workerEnv = "SLUICE_LLMFLEET_WORKER"

// callTimeout bounds one chat call, its waits for the bucket and its
// retries included.
const callTimeout = 2 * time.Minute

// workerSpec is what a worker process is told to do.
type workerSpec struct {
	ID      int    `json:"id"` // 0 to procs-1
	Procs   int    `json:"procs"`
	Workers int    `json:"workers"`
	Jobs    int    `json:"jobs"` // of the whole fleet; this process does every Procs-th
	Seed    uint64 `json:"seed"`
	BaseURL string `json:"base_url"`
	APIKey  string `json:"api_key"`
	Model   string `json:"model"`
	Redis   string `json:"redis"` // URL
	// The limits the bucket is configured with, and its burst as time at
	// their rates.
	RPM   float64       `json:"rpm"`
	TPM   float64       `json:"tpm"`
	Burst time.Duration `json:"burst"`
	Start int64         `json:"start"` // unix nanoseconds: the fleet's common start
	// Metrics is the address on which to serve the metrics; "": none.
	Metrics string `json:"metrics,omitempty"`
}

// message is one line a worker writes on its stdout: a job's result, or
// the worker's totals, its last line.
type message struct {
	Job  *jobResult `json:"job,omitempty"`
	Done *totals    `json:"done,omitempty"`
}

// jobResult is what became of one chat call.
type jobResult struct {
	Index  int   `json:"i"`
	Sent   int64 `json:"sent"` // unix ns: when its last attempt was sent; 0 if none was
	End    int64 `json:"end"`  // unix ns: when the call returned
	Tokens int   `json:"tokens"`
	// Throttled holds the times (unix ns) of the 429 responses its
	// attempts got.
	Throttled []int64 `json:"throttled,omitempty"`
	Err       string  `json:"err,omitempty"`
}

// totals is what a worker reports at the end.
type totals struct {
	// Ledger is the tokens the bucket was charged on behalf of this
	// process, net of the refunds and debits of reconciliation.
	Ledger   float64 `json:"ledger"`
	Attempts int64   `json:"attempts"` // requests sent upstream, retries included
}

// workerMain runs a worker process and returns its exit status.
func workerMain(specJSON string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var spec workerSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "llmfleet worker: bad %s: %v\n", workerEnv, err)
		return 1
	}
	if err := work(ctx, spec, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "llmfleet worker %d: %v\n", spec.ID+1, err)
		return 1
	}
	return 0
}

// work makes the chat calls of process spec.ID, jobs spec.ID,
// spec.ID+spec.Procs, …, with spec.Workers goroutines, through an
// llmclient.Client that charges the fleet's bucket in Redis. It writes a
// message to w for each job and one with its totals at the end.
func work(ctx context.Context, spec workerSpec, w io.Writer) error {
	opt, err := redis.ParseURL(spec.Redis)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	pctx, cancel := context.WithTimeout(ctx, redisTimeout)
	err = rdb.Ping(pctx).Err() // connect before the start
	cancel()
	if err != nil {
		return fmt.Errorf("cannot reach Redis at %s: %w", demo.Redacted(spec.Redis), err)
	}

	// The fleet's one bucket: every process makes the same, on the same
	// key (the API's host and a hash of the API key), in the same Redis.
	requests, tokens := fleetLimits(spec.RPM, spec.TPM, spec.Burst)
	bopts := []bucket.Option{bucket.WithLimit(bucket.Tokens, tokens)}
	var topts []transport.Option
	if spec.Metrics != "" {
		ln, err := net.Listen("tcp", spec.Metrics)
		if err != nil {
			return fmt.Errorf("serve metrics: %w", err)
		}
		m, err := demo.ServeMetrics(ln)
		if err != nil {
			ln.Close()
			return err
		}
		defer m.Close()
		bopts = append(bopts, bucket.WithMeterProvider(m.Provider))
		topts = append(topts, transport.WithMeterProvider(m.Provider))
	}
	led := &ledger{Bucket: bucket.NewRedis(rdb, requests, bopts...)}

	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = spec.Workers
	defer base.CloseIdleConnections()
	up := &upstream{base: base}
	client := llmclient.New(spec.BaseURL, spec.APIKey,
		llmclient.WithBucket(led),
		llmclient.WithHTTPClient(&http.Client{Transport: up}),
		llmclient.WithTransportOptions(topts...))

	var (
		mu     sync.Mutex
		enc    = json.NewEncoder(w)
		encErr error
	)
	emit := func(m message) {
		mu.Lock()
		defer mu.Unlock()
		if encErr == nil {
			encErr = enc.Encode(m)
		}
	}

	if err := demo.SleepUntil(ctx, time.Unix(0, spec.Start)); err != nil {
		return err
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range spec.Workers {
		wg.Go(func() {
			for i := range next {
				r := call(ctx, client, spec, i)
				emit(message{Job: &r})
			}
		})
	}
	for i := spec.ID; i < spec.Jobs && ctx.Err() == nil; i += spec.Procs {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	emit(message{Done: &totals{Ledger: led.tokens(), Attempts: up.attempts()}})
	return encErr
}

// fleetLimits returns the limits of the fleet's bucket: rpm requests and
// tpm tokens per minute, with a burst of burst's worth of each (and at
// least one request, and the largest job).
func fleetLimits(rpm, tpm float64, burst time.Duration) (requests, tokens bucket.Limit) {
	requests = bucket.Limit{Rate: rpm / 60, Burst: max(rpm/60*burst.Seconds(), 1)}
	tokens = bucket.Limit{Rate: tpm / 60, Burst: max(tpm/60*burst.Seconds(), maxJobTokens)}
	return requests, tokens
}

// call makes job i's chat call.
func call(ctx context.Context, client *llmclient.Client, spec workerSpec, i int) jobResult {
	tr := &trace{}
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, traceKey{}, tr), callTimeout)
	defer cancel()
	resp, err := client.Chat(ctx, job(spec.Seed, i, spec.Model))
	r := jobResult{Index: i, End: time.Now().UnixNano()}
	tr.mu.Lock()
	r.Sent, r.Throttled = tr.sent, tr.throttled
	tr.mu.Unlock()
	if err != nil {
		r.Err = err.Error()
		return r
	}
	r.Tokens = resp.Usage.TotalTokens
	return r
}

// ledger is a bucket.Bucket that keeps count of the tokens it was charged:
// what reservations took, net of adjustments (refunds of cancelled waits,
// reconciliation with the usage the responses report).
type ledger struct {
	bucket.Bucket

	mu  sync.Mutex
	sum float64
}

func (l *ledger) Reserve(ctx context.Context, key string, cost bucket.Cost, maxWait time.Duration) (bucket.Reservation, error) {
	r, err := l.Bucket.Reserve(ctx, key, cost, maxWait)
	if err == nil && r.OK {
		l.add(cost[bucket.Tokens])
	}
	return r, err
}

func (l *ledger) Adjust(ctx context.Context, key string, delta bucket.Cost) error {
	err := l.Bucket.Adjust(ctx, key, delta)
	if err == nil {
		l.add(delta[bucket.Tokens])
	}
	return err
}

// Settle passes a served call's refund or debit on as one (bucket.Settle).
func (l *ledger) Settle(ctx context.Context, key string, delta bucket.Cost) error {
	err := bucket.Settle(ctx, l.Bucket, key, delta)
	if err == nil {
		l.add(delta[bucket.Tokens])
	}
	return err
}

func (l *ledger) add(n float64) {
	l.mu.Lock()
	l.sum += n
	l.mu.Unlock()
}

func (l *ledger) tokens() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sum
}

// traceKey is the context key of a call's *trace.
type traceKey struct{}

// trace records what the attempts of one call met upstream.
type trace struct {
	mu        sync.Mutex
	sent      int64   // unix ns of the last attempt
	throttled []int64 // unix ns of its 429 responses
}

// upstream is the http.RoundTripper under sluice's: it sees every attempt
// that leaves the process, and records it in the call's trace.
type upstream struct {
	base http.RoundTripper

	mu sync.Mutex
	n  int64
}

func (u *upstream) RoundTrip(req *http.Request) (*http.Response, error) {
	sent := time.Now()
	u.mu.Lock()
	u.n++
	u.mu.Unlock()
	resp, err := u.base.RoundTrip(req)
	if tr, ok := req.Context().Value(traceKey{}).(*trace); ok {
		tr.mu.Lock()
		tr.sent = sent.UnixNano()
		if err == nil && resp.StatusCode == http.StatusTooManyRequests {
			tr.throttled = append(tr.throttled, time.Now().UnixNano())
		}
		tr.mu.Unlock()
	}
	return resp, err
}

func (u *upstream) attempts() int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n
}
