package transport_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/fleettest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
)

// The models of TestFleetModels, each with limits of its own, as OpenAI
// gives each model its own: requests and tokens per minute (at rates that
// make a run take seconds), and for o3 a daily cap too, with a "day" short
// enough to bind (a cap of 40 refilled at 6 a second). One plan, the same
// limits, in the fleet's bucket.Route.
var fleetModels = []struct {
	name             string
	requests, tokens bucket.Limit
	day              bucket.Limit // zero: none
	calls            int
}{
	{"gpt-4.1-mini", bucket.Limit{Rate: 20, Burst: 20}, bucket.Limit{Rate: 5000, Burst: 5000}, bucket.Limit{}, 200},
	{"gpt-4.1", bucket.Limit{Rate: 10, Burst: 10}, bucket.Limit{Rate: 1000, Burst: 1000}, bucket.Limit{}, 100},
	{"o3", bucket.Limit{Rate: 10, Burst: 10}, bucket.Limit{Rate: 5000, Burst: 5000}, bucket.Limit{Rate: 6, Burst: 40}, 100},
}

const (
	modelsWorkerEnv  = "SLUICE_MODELS_FLEET_WORKER"
	modelsProcs      = 4
	modelsGoroutines = 8
	modelsMaxTokens  = 100
)

// modelsPrompt is every call's prompt: 200 characters, 50 tokens.
var modelsPrompt = strings.Repeat("four", 50)

type modelsWorkerConfig struct {
	Index, Procs int
	Redis, URL   string
}

type modelsResult struct {
	OK, Failed int
	Err        string
	Last       int64 // Unix ns of its last completion
}

// modelsPlan is the fleet's bucket: a Redis bucket per model, routed by
// the model ModelKey puts in the key.
func modelsPlan(rdb redis.UniversalClient) *bucket.Routed {
	plan := map[string]bucket.Bucket{}
	for _, m := range fleetModels {
		opts := []bucket.Option{bucket.WithLimit(bucket.Tokens, m.tokens)}
		if m.day != (bucket.Limit{}) {
			opts = append(opts, bucket.WithWindow(bucket.Requests, m.day))
		}
		plan[m.name] = bucket.NewRedis(rdb, m.requests, opts...)
	}
	def := bucket.NewRedis(rdb, bucket.PerSecond(1), bucket.WithLimit(bucket.Tokens, bucket.PerSecond(1000)))
	return bucket.Route(llmclient.KeyModel, plan, def)
}

// modelsJobs lists the model of every job of the fleet, interleaved: job j
// of model m comes at about j/calls(m) of the run.
func modelsJobs() []string {
	var jobs []string
	next := make([]int, len(fleetModels))
	for len(jobs) < totalModelCalls() {
		best, at := -1, math.Inf(1)
		for k, m := range fleetModels {
			if next[k] < m.calls {
				if f := float64(next[k]) / float64(m.calls); f < at {
					best, at = k, f
				}
			}
		}
		jobs = append(jobs, fleetModels[best].name)
		next[best]++
	}
	return jobs
}

func totalModelCalls() int {
	n := 0
	for _, m := range fleetModels {
		n += m.calls
	}
	return n
}

func modelsWorker() int {
	var cfg modelsWorkerConfig
	if err := json.Unmarshal([]byte(os.Getenv(modelsWorkerEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "models worker: config:", err)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Redis, PoolSize: 2 * modelsGoroutines})
	defer rdb.Close()
	plan := modelsPlan(rdb)
	if _, err := plan.Reserve(context.Background(), "warm-up/none", bucket.N(1), 0); err != nil {
		fmt.Fprintln(os.Stderr, "models worker: redis:", err)
		return 2
	}
	base := &http.Transport{MaxIdleConnsPerHost: 2 * modelsGoroutines}
	defer base.CloseIdleConnections()
	client := llmclient.New(cfg.URL, "sk-models", llmclient.WithBucket(plan),
		llmclient.WithHTTPClient(&http.Client{Transport: base}))
	// Open the goroutines' connections before the start: a cold one is late
	// by its handshake, and the fake API's limits start counting at the
	// first arrival, not at the fleet's first reservation. The fake answers
	// a request without a model 404 before its limits.
	var warm sync.WaitGroup
	for range modelsGoroutines {
		warm.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, cfg.URL+"/chat/completions", strings.NewReader("{}"))
			if resp, err := base.RoundTrip(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	warm.Wait()

	startAt, err := fleettest.Ready()
	if err != nil {
		fmt.Fprintln(os.Stderr, "models worker:", err)
		return 2
	}
	time.Sleep(time.Until(startAt))
	jobs := modelsJobs()
	t := fleettest.Run(cfg.Index, cfg.Procs, len(jobs), modelsGoroutines, func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := client.Chat(ctx, llmclient.ChatRequest{Model: jobs[i], MaxTokens: modelsMaxTokens,
			Messages: []llmclient.Message{{Role: "user", Content: modelsPrompt}}})
		return err
	})
	res := modelsResult{OK: t.OK, Failed: t.Lost, Err: t.Err, Last: t.Last}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

// dayCap is o3's daily cap at the fake API: a token bucket in front of its
// handler that answers 429, with Retry-After and no quota headers, when the
// day is spent; it counts what it let through.
type dayCap struct {
	mu       sync.Mutex
	limit    bucket.Limit
	tokens   float64
	at       time.Time
	passed   int64
	refused  int64
	next     http.Handler
	admitted []time.Time
}

func (d *dayCap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	now := time.Now()
	if d.at.IsZero() {
		d.tokens, d.at = d.limit.Burst, now
	}
	d.tokens = min(d.limit.Burst, d.tokens+now.Sub(d.at).Seconds()*d.limit.Rate)
	d.at = now
	if d.tokens < 1 {
		d.refused++
		wait := (1 - d.tokens) / d.limit.Rate
		d.mu.Unlock()
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait))))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"error":{"message":"Rate limit reached for requests per day (RPD)","type":"requests","code":"rate_limit_exceeded"}}`)
		return
	}
	d.tokens--
	d.passed++
	d.admitted = append(d.admitted, now)
	d.mu.Unlock()
	d.next.ServeHTTP(w, r)
}

// TestFleetModels is issue 14's acceptance run of per-model limits: one
// http.Client (llmclient's, through the OpenAI preset) in 4 processes × 8
// goroutines, a bucket.Route of a Redis bucket per model, against a fake
// API serving three models with limits of their own (and a daily cap for
// one). Each model stays within its own limits as the server counts them,
// no call is lost, at most 1% are refused, and the fleet finishes within
// 10% of the binding model's ideal. (At the exact limits, a model whose
// requests bind draws one 429 at the end of its start-up burst: the fake's
// refill starts at the first arrival, which the Redis round trip delays
// past the fleet's first reservation.)
func TestFleetModels(t *testing.T) {
	rs := redistest.Own(t)
	handlers := map[string]*llmtest.Handler{}
	routes := map[string]http.Handler{}
	var day *dayCap
	for _, m := range fleetModels {
		h := llmtest.NewHandler(llmtest.Config{
			Requests:     llmtest.TokenBucket(int64(m.requests.Rate), time.Second, int64(m.requests.Burst)),
			Tokens:       llmtest.TokenBucket(int64(m.tokens.Rate), time.Second, int64(m.tokens.Burst)),
			Headers:      llmtest.OpenAIHeaders,
			ChargeCap:    true,
			ReplyTokens:  20,
			Latency:      50 * time.Millisecond,
			TokenLatency: time.Millisecond,
		})
		handlers[m.name] = h
		routes[m.name] = h
		if m.day != (bucket.Limit{}) {
			day = &dayCap{limit: m.day, next: h}
			routes[m.name] = day
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model string `json:"model"`
		}
		raw, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(raw))
		if json.Unmarshal(raw, &body) != nil || routes[body.Model] == nil {
			http.Error(w, "no such model", http.StatusNotFound)
			return
		}
		routes[body.Model].ServeHTTP(w, r)
	}))
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var procs []*fleettest.Worker
	defer func() {
		cancel()
		for _, p := range procs {
			p.Wait()
		}
	}()
	for i := range modelsProcs {
		p, err := fleettest.Start(ctx, modelsWorkerEnv, modelsWorkerConfig{Index: i, Procs: modelsProcs, Redis: rs.Addr, URL: srv.URL + "/v1"})
		require.NoError(t, err)
		procs = append(procs, p)
	}
	require.NoError(t, fleettest.AwaitReady(procs))
	for _, h := range handlers {
		h.Reset()
	}
	start := time.Now().Add(100 * time.Millisecond)
	require.NoError(t, fleettest.Release(procs, start))
	var ok, failed int
	var last int64
	var firstErr string
	for i, p := range procs {
		var r modelsResult
		require.NoError(t, p.Report(i, &r))
		ok, failed, last = ok+r.OK, failed+r.Failed, max(last, r.Last)
		if firstErr == "" {
			firstErr = r.Err
		}
	}
	makespan := time.Duration(last - start.UnixNano())

	// The ideal: the least time in which each model's limits, starting
	// full, admit its calls as the server charges them; the binding
	// model's is the fleet's.
	var ideal time.Duration
	var answered, refused int64
	for _, m := range fleetModels {
		st := handlers[m.name].Stats()
		perCall := float64(llmtest.PromptTokens(llmtest.ChatRequest{Messages: []llmtest.Message{{Role: "user", Content: modelsPrompt}}}) + modelsMaxTokens)
		need := max((float64(m.calls)-m.requests.Burst)/m.requests.Rate, (float64(m.calls)*perCall-m.tokens.Burst)/m.tokens.Rate)
		if m.day != (bucket.Limit{}) {
			need = max(need, (float64(m.calls)-m.day.Burst)/m.day.Rate)
		}
		mi := time.Duration(need * float64(time.Second))
		ideal = max(ideal, mi)
		answered += st.Accepted + st.Rejected
		refused += st.Rejected
		// Within its own limits, as the server counts: a token bucket
		// admits at most burst + rate·w in any w.
		reqs := handlers[m.name].MaxInWindow(llmtest.Requests, time.Second)
		toks := handlers[m.name].MaxInWindow(llmtest.Tokens, time.Second)
		t.Logf("%s: %d accepted, %d refused (requests %v, tokens %v); most in a second: %d requests, %d tokens; ideal %.2f s",
			m.name, st.Accepted, st.Rejected, st.RejectedBy[0], st.RejectedBy[1], reqs, toks, mi.Seconds())
		for _, pt := range handlers[m.name].Series(100 * time.Millisecond) {
			if pt.Rejected > 0 {
				t.Logf("%s: %d refused at %.1f s", m.name, pt.Rejected, pt.Start.Sub(start).Seconds())
			}
		}
		assert.EqualValues(t, m.calls, st.Accepted, "%s: every call admitted once", m.name)
		assert.LessOrEqual(t, float64(reqs), m.requests.Burst+m.requests.Rate, m.name)
		assert.LessOrEqual(t, float64(toks), m.tokens.Burst+m.tokens.Rate, m.name)
	}
	day.mu.Lock()
	answered += day.refused
	refused += day.refused
	t.Logf("o3's day: %d passed, %d refused", day.passed, day.refused)
	for i, at := range day.admitted {
		// the cap admits at most burst + rate·t by t
		bound := day.limit.Burst + day.limit.Rate*at.Sub(day.admitted[0]).Seconds()
		if float64(i+1) > bound+1 {
			t.Errorf("o3's day: %d admitted by %.2f s, above %.1f", i+1, at.Sub(day.admitted[0]).Seconds(), bound)
			break
		}
	}
	day.mu.Unlock()
	t.Logf("fleet: %d ok, %d failed (%s); %d of %d answers refused (%.2f%%); makespan %.2f s, ideal %.2f s (%.3fx)",
		ok, failed, firstErr, refused, answered, 100*float64(refused)/float64(answered), makespan.Seconds(), ideal.Seconds(),
		makespan.Seconds()/ideal.Seconds())
	assert.Equal(t, totalModelCalls(), ok, "no call lost")
	assert.Zero(t, failed)
	assert.LessOrEqual(t, float64(refused), 0.01*float64(answered), "at most 1% refused")
	assert.LessOrEqual(t, makespan.Seconds(), 1.10*ideal.Seconds(), "within 10% of the binding model's ideal")
}
