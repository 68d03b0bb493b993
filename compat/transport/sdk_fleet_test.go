package transport_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/fleettest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
)

// The SDK fleet (issue 14): sdkProcs processes of sdkGoroutines goroutines
// make sdkCalls calls in all with an official SDK, through its preset and
// one Redis bucket at the fake's limits, per minute as Anthropic's and
// OpenAI's are. The calls' sizes vary (sdkWorkload).
const (
	sdkProcs      = 4
	sdkGoroutines = 8
	sdkCalls      = 240
	// sdkCallTimeout bounds one call, retries and waits included.
	sdkCallTimeout = 2 * time.Minute
)

// sdkWorkerEnv holds, in a worker process of TestSDKFleet (this test binary
// started again), its sdkWorkerConfig as JSON.
const sdkWorkerEnv = "SLUICE_TRANSPORT_SDK_WORKER"

// APIs of TestSDKFleet.
const (
	sdkAnthropic = "anthropic" // anthropic-sdk-go, llmclient.Anthropic, llmtest's Messages API
	sdkOpenAI    = "openai"    // openai-go, llmclient.OpenAI, llmtest's chat completions
)

// sdkWorkerConfig is what a worker process is told to do.
type sdkWorkerConfig struct {
	API      string
	Redis    string // address of the Redis server
	Prefix   string // of the bucket's Redis keys
	URL      string // the SDK's base URL
	Worker   int    // this process's number: it makes the calls i ≡ Worker (mod Workers)
	Workers  int
	Calls    int // in the whole fleet
	Routines int // goroutines
	Reply    int // the fake's ReplyTokens
	// Limits are the bucket's (and the fake's) per minute, by dimension.
	Limits map[string]float64
}

// sdkResult is what a worker prints on stdout when it is done.
type sdkResult struct {
	OK, Failed int
	Throttled  int64 // 429s its attempts got
	Last       int64 // Unix nanoseconds of its last completion
	Err        string
}

// sdkCall is one call of the workload.
type sdkCall struct {
	system, user string
	maxTokens    int
	stream       bool
	tools        bool // Anthropic only: a tool definition in the request
}

// sdkWorkload returns call i of the workload: a system prompt of up to
// 8,000 characters, a user message of 20 to 420, max_tokens of 50 to 400,
// every third call streamed, every fourth with a tool.
func sdkWorkload(i int) sdkCall {
	r := rand.New(rand.NewPCG(uint64(i), 14))
	return sdkCall{
		system:    filler(r.IntN(8000)),
		user:      filler(20 + r.IntN(400)),
		maxTokens: []int{50, 100, 200, 400}[r.IntN(4)],
		stream:    i%3 == 0,
		tools:     i%4 == 1,
	}
}

// filler returns n characters of text.
func filler(n int) string {
	const s = "The quick brown fox jumps over the lazy dog. "
	return strings.Repeat(s, n/len(s)+1)[:n]
}

// sdkWorker runs one worker process of TestSDKFleet and returns its exit
// code. It prints "ready" once set up, reads the Unix nanoseconds at which
// to begin from stdin, makes its calls, then prints an sdkResult.
func sdkWorker() int {
	var cfg sdkWorkerConfig
	if err := json.Unmarshal([]byte(os.Getenv(sdkWorkerEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "sdk worker: config:", err)
		return 2
	}
	base := &http.Transport{MaxIdleConnsPerHost: 2 * cfg.Routines}
	defer base.CloseIdleConnections()
	var throttled atomic.Int64
	counted := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := base.RoundTrip(r)
		if err == nil && resp.StatusCode == http.StatusTooManyRequests {
			throttled.Add(1)
		}
		return resp, err
	})
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Redis, PoolSize: 2 * cfg.Routines, MinIdleConns: cfg.Routines})
	defer rdb.Close()
	// Failing closed, with time to spare: a fallback to a bucket of the
	// process's own would void the measurement, and must show.
	opts := []bucket.Option{bucket.WithPrefix(cfg.Prefix), bucket.WithFailClosed(), bucket.WithRedisTimeout(5 * time.Second)}
	for d, n := range cfg.Limits {
		if d != bucket.Requests {
			opts = append(opts, bucket.WithLimit(d, bucket.PerMinute(n)))
		}
	}
	b := bucket.NewRedis(rdb, bucket.PerMinute(cfg.Limits[bucket.Requests]), opts...)
	// Load the scripts and connect before the start, on a key of its own.
	if _, err := b.Reserve(context.Background(), "warm-up", bucket.N(1), 0); err != nil {
		fmt.Fprintln(os.Stderr, "sdk worker: redis:", err)
		return 2
	}
	var call func(ctx context.Context, c sdkCall) error
	switch cfg.API {
	case sdkAnthropic:
		client := anthropic.NewClient(aoption.WithBaseURL(cfg.URL), aoption.WithAPIKey("sk-ant-fleet"),
			aoption.WithHTTPClient(&http.Client{Transport: transport.New(counted, llmclient.Anthropic(b))}),
			aoption.WithMaxRetries(0))
		call = func(ctx context.Context, c sdkCall) error { return callAnthropic(ctx, &client, c, cfg.Reply) }
	case sdkOpenAI:
		client := openai.NewClient(option.WithBaseURL(cfg.URL), option.WithAPIKey("sk-fleet"),
			option.WithHTTPClient(&http.Client{Transport: transport.New(counted, llmclient.OpenAI(b))}),
			option.WithMaxRetries(0))
		call = func(ctx context.Context, c sdkCall) error { return callOpenAI(ctx, &client, c, cfg.Reply) }
	default:
		fmt.Fprintln(os.Stderr, "sdk worker: unknown API", cfg.API)
		return 2
	}

	startAt, err := fleettest.Ready()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sdk worker:", err)
		return 2
	}
	time.Sleep(time.Until(startAt))

	t := fleettest.Run(cfg.Worker, cfg.Workers, cfg.Calls, cfg.Routines, func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), sdkCallTimeout)
		defer cancel()
		return call(ctx, sdkWorkload(i))
	})
	res := sdkResult{OK: t.OK, Failed: t.Lost, Err: t.Err, Last: t.Last}
	res.Throttled = throttled.Load()
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

// callAnthropic makes call c with the Messages API, reads its reply to the
// end and checks it is min(max_tokens, reply) tokens long.
func callAnthropic(ctx context.Context, client *anthropic.Client, c sdkCall, reply int) error {
	params := anthropic.MessageNewParams{
		Model:     "claude-fleet",
		MaxTokens: int64(c.maxTokens),
		System:    []anthropic.TextBlockParam{{Text: c.system}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(c.user))},
	}
	if c.tools {
		params.Tools = []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{
			Name:        "get_weather",
			Description: anthropic.String("The weather at a place, now."),
			InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{
				"place": map[string]any{"type": "string", "description": "A city and its country."}}},
		}}}
	}
	var m *anthropic.Message
	if c.stream {
		stream := client.Messages.NewStreaming(ctx, params)
		m = new(anthropic.Message)
		for stream.Next() {
			if err := m.Accumulate(stream.Current()); err != nil {
				stream.Close()
				return err
			}
		}
		if err := errors.Join(stream.Err(), stream.Close()); err != nil {
			return err
		}
	} else {
		var err error
		if m, err = client.Messages.New(ctx, params); err != nil {
			return err
		}
	}
	if want := min(c.maxTokens, reply); m.Usage.OutputTokens != int64(want) || len(m.Content) != 1 {
		return fmt.Errorf("a reply of %d tokens in %d blocks, want %d in 1", m.Usage.OutputTokens, len(m.Content), want)
	}
	return nil
}

// callOpenAI makes call c with chat completions, reads its reply to the
// end and checks it is min(max_tokens, reply) tokens long.
func callOpenAI(ctx context.Context, client *openai.Client, c sdkCall, reply int) error {
	params := openai.ChatCompletionNewParams{
		Model:               "gpt-fleet",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(c.system), openai.UserMessage(c.user)},
		MaxCompletionTokens: openai.Int(int64(c.maxTokens)),
	}
	var usage openai.CompletionUsage
	if c.stream {
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := client.Chat.Completions.NewStreaming(ctx, params)
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := errors.Join(stream.Err(), stream.Close()); err != nil {
			return err
		}
		usage = acc.Usage
	} else {
		res, err := client.Chat.Completions.New(ctx, params)
		if err != nil {
			return err
		}
		usage = res.Usage
	}
	if want := min(c.maxTokens, reply); usage.CompletionTokens != int64(want) {
		return fmt.Errorf("a reply of %d tokens, want %d", usage.CompletionTokens, want)
	}
	return nil
}

// sdkScenario is one run of TestSDKFleet.
type sdkScenario struct {
	name string
	api  string
	// reply is the fake's ReplyTokens: the longest reply.
	reply int
	// limits are the fake's and the bucket's, per minute, by dimension:
	// sized so that the workload takes about 20 s at the binding one, the
	// rest not far behind.
	limits map[string]float64
}

// sdkRun is what one run of TestSDKFleet measured.
type sdkRun struct {
	ok, failed int
	throttled  int64 // 429s the workers got
	stats      llmtest.Stats
	makespan   time.Duration
	errs       []string // the first error of each worker that had one
	by429      string   // 429s by second of the run, where there were any
	admitted   string   // requests admitted by second
	// ideal is the least makespan the limits allow the demand the server
	// counted, binding the dimension that does; use is, by dimension, the
	// demand over what the limit allows in the makespan.
	ideal   time.Duration
	binding string
	use     map[string]float64
}

// TestSDKFleet is issue 14's acceptance test of the presets with the
// official SDKs: anthropic-sdk-go through llmclient.Anthropic against
// llmtest's Messages API, with limits on requests, input tokens and output
// tokens apart that it reports in anthropic-ratelimit-* headers (tokens-*
// the most restrictive of the two) and a Retry-After in whole seconds; and
// openai-go through llmclient.OpenAI against its chat completions, with
// limits on requests and tokens reported in OpenAI's headers. Each run:
// sdkProcs processes of sdkGoroutines goroutines, one Redis bucket at the
// fake's limits, the SDK's own retries off. Every call succeeds, at most 2%
// draw a 429, and the makespan is at most 1.15 times the ideal, the least
// the binding limit allows the demand the server counted. The
// runs go at once, each with its own server, bucket keys and processes.
func TestSDKFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("the SDK fleet test takes about 30s")
	}
	addr := redistest.Addr(t)
	anthropicLimits := func(otpm float64) map[string]float64 {
		return map[string]float64{bucket.Requests: 200, bucket.InputTokens: 205_000, bucket.OutputTokens: otpm}
	}
	scenarios := []sdkScenario{
		// Replies end before max_tokens: 27,000 output tokens used of
		// 45,000 reserved. The bucket reserves max_tokens, as the fake
		// charges it at admission, and the refunds of the calls served,
		// from every process, move up every waiter (bucket.Settle,
		// bucket.WaitMax): 1.00-1.08 x the ideal. With the end of the queue
		// only moved up, the waiters in its middle kept their slots:
		// 1.05-1.20 x.
		{name: "anthropic", api: sdkAnthropic, reply: 150, limits: anthropicLimits(20_000)},
		// Replies as long as max_tokens: what is reserved is used.
		{name: "anthropic-full-replies", api: sdkAnthropic, reply: 400, limits: anthropicLimits(34_000)},
		{name: "openai", api: sdkOpenAI, reply: 150,
			limits: map[string]float64{bucket.Requests: 200, bucket.Tokens: 210_000}},
	}
	runs := make([]sdkRun, len(scenarios))
	errs := make([]error, len(scenarios))
	began := time.Now()
	var wg sync.WaitGroup
	for i, sc := range scenarios {
		wg.Go(func() { runs[i], errs[i] = runSDKFleet(addr, sc) })
	}
	wg.Wait()
	wall := time.Since(began)

	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%d processes x %d goroutines, %d calls; all runs at once, wall time %.1fs\n",
		sdkProcs, sdkGoroutines, sdkCalls, wall.Seconds())
	fmt.Fprintf(&sb, "%-24s %-58s %5s %6s %5s %6s %9s %8s %-14s %7s  %s\n",
		"run", "limits per minute", "ok", "failed", "429s", "429 %", "makespan", "ideal", "binding", "x ideal", "demand / allowed in the makespan")
	for i, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			require.NoError(t, errs[i])
			r := runs[i]
			t.Logf("server: %d accepted, %d rejected (workers counted %d 429s; by requests, tokens, input, output tokens: %v)\n429s by second: %s\nadmitted by second: %s",
				r.stats.Accepted, r.stats.Rejected, r.throttled, r.stats.RejectedBy, r.by429, r.admitted)
			assert.Empty(t, r.errs, "errors")
			assert.Equal(t, sdkCalls, r.ok, "every call succeeds")
			assert.LessOrEqual(t, float64(r.stats.Rejected), 0.02*sdkCalls, "429s at most 2% of the calls")
			assert.LessOrEqual(t, r.makespan.Seconds(), 1.15*r.ideal.Seconds(), "makespan at most 1.15 x the ideal %v", r.ideal)
			var limits, use []string
			for _, d := range []string{bucket.Requests, bucket.InputTokens, bucket.OutputTokens, bucket.Tokens} {
				if n, ok := sc.limits[d]; ok {
					limits = append(limits, fmt.Sprintf("%s %.0f", d, n))
					use = append(use, fmt.Sprintf("%s %.3f", d, r.use[d]))
				}
			}
			x := r.makespan.Seconds() / r.ideal.Seconds()
			fmt.Fprintf(&sb, "%-24s %-58s %5d %6d %5d %5.1f%% %8.2fs %7.2fs %-14s %7.3f  %s; 1.15x: %s\n",
				sc.name, strings.Join(limits, ", "), r.ok, r.failed, r.stats.Rejected, 100*float64(r.stats.Rejected)/sdkCalls,
				r.makespan.Seconds(), r.ideal.Seconds(), r.binding, x, strings.Join(use, ", "), met(x <= 1.15))
		})
	}
	t.Log(sb.String())
}

// runSDKFleet runs sc's server and worker processes and returns what they
// measured. It kills its workers if it fails.
func runSDKFleet(addr string, sc sdkScenario) (sdkRun, error) {
	perMinute := func(d string) llmtest.Limit {
		n, ok := sc.limits[d]
		if !ok {
			return llmtest.Limit{}
		}
		return llmtest.TokenBucket(int64(n), time.Minute, int64(n))
	}
	cfg := llmtest.Config{ReplyTokens: sc.reply, Requests: perMinute(bucket.Requests), Tokens: perMinute(bucket.Tokens),
		InputTokens: perMinute(bucket.InputTokens), OutputTokens: perMinute(bucket.OutputTokens)}
	switch sc.api {
	case sdkAnthropic:
		cfg.Headers = llmtest.AnthropicHeaders
	case sdkOpenAI:
		// OpenAI counts a call's max_tokens against the tokens limit,
		// whatever the completion uses, as the preset reckons it
		// (llmclient.MeterOpenAIUsage).
		cfg.Headers, cfg.ChargeCap = llmtest.OpenAIHeaders, true
	}
	srv := llmtest.NewServer(cfg)
	defer srv.Close()
	url := srv.URL
	if sc.api == sdkAnthropic {
		url = srv.AnthropicURL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var procs []*fleettest.Worker
	defer func() {
		cancel() // kills the workers still running
		for _, p := range procs {
			p.Wait() // a no-op once waited for
		}
	}()
	prefix := fmt.Sprintf("sluice-sdk-%s-%d", sc.name, time.Now().UnixNano())
	for i := range sdkProcs {
		p, err := fleettest.Start(ctx, sdkWorkerEnv, sdkWorkerConfig{
			API: sc.api, Redis: addr, Prefix: prefix, URL: url,
			Worker: i, Workers: sdkProcs, Calls: sdkCalls, Routines: sdkGoroutines, Reply: sc.reply, Limits: sc.limits,
		})
		if err != nil {
			return sdkRun{}, err
		}
		procs = append(procs, p)
	}
	if err := fleettest.AwaitReady(procs); err != nil {
		return sdkRun{}, err
	}
	srv.Reset() // the limits full, and the counters from about the start
	start := time.Now().Add(100 * time.Millisecond)
	if err := fleettest.Release(procs, start); err != nil {
		return sdkRun{}, err
	}
	var run sdkRun
	var last int64
	for i, p := range procs {
		var r sdkResult
		if err := p.Report(i, &r); err != nil {
			return sdkRun{}, err
		}
		if r.Err != "" {
			run.errs = append(run.errs, fmt.Sprintf("worker %d: %s", i+1, r.Err))
		}
		run.ok += r.OK
		run.failed += r.Failed
		run.throttled += r.Throttled
		last = max(last, r.Last)
	}
	run.makespan = time.Unix(0, last).Sub(start)
	run.stats = srv.Stats()
	var by, adm []string
	for i, pt := range srv.Series(time.Second) {
		if pt.Rejected > 0 {
			by = append(by, fmt.Sprintf("%d:%d", i, pt.Rejected))
		}
		adm = append(adm, strconv.FormatInt(pt.Requests, 10))
	}
	run.by429, run.admitted = strings.Join(by, " "), strings.Join(adm, " ")
	// The demand, as the server counted what it admitted.
	demand := map[string]float64{
		bucket.Requests:     float64(run.stats.Accepted),
		bucket.InputTokens:  float64(run.stats.PromptTokens),
		bucket.OutputTokens: float64(run.stats.CompletionTokens),
		bucket.Tokens:       float64(run.stats.ChargedTokens), // OpenAI's: prompt and cap (ChargeCap)
	}
	run.use = make(map[string]float64)
	for d, l := range sc.limits {
		n := demand[d]
		// A bucket of l a minute, full at the start: l at once, then l/60 a second.
		if ideal := time.Duration(max(n-l, 0) / (l / 60) * float64(time.Second)); ideal >= run.ideal {
			run.ideal, run.binding = ideal, d
		}
		run.use[d] = n / (l + l/60*run.makespan.Seconds())
	}
	return run, nil
}
