package llmclient_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/llmfixture"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/transport"
)

// largeImage is the base64 of an image of 9 MiB, as a data URL carries it.
var largeImage = strings.Repeat("iVBORw0KGgoAAAANSUhEUgAA", 9<<20/24)

// largeRequest is a chat completion of 9 MiB, nearly all of it an image as
// a base64 data URL, its messages before its model and its max_tokens: the
// order in which openai-go and anthropic-sdk-go write a request's fields.
func largeRequest(model string) string {
	return `{"messages":[{"role":"user","content":[{"type":"text","text":"What is in this image?"},` +
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,` + largeImage + `"}}]}],` +
		`"model":"` + model + `","max_tokens":100}`
}

// TestRouteHoldsForALargeRequest: ModelKey read the first 8 MiB of a body,
// so a 9 MiB request with its model last was keyed without it, and
// bucket.Route charged it to the default: 8 calls reached the upstream in
// 20-277 ms against gpt-4.1's 2 a second. Each is now charged to its model,
// whose clock stands still: of 8 calls, Burst + Rate*0 = 2 reach the
// upstream, and the 6 others, whose slots are past the 100 ms they may
// wait, fail at once with bucket.ErrDeadline. The preset's cost is
// replaced by {requests: 1}: RequestCost decodes each 9 MiB body whole
// (about 1 s on a loaded machine, under -race 5), and the key is what is
// tested.
func TestRouteHoldsForALargeRequest(t *testing.T) {
	const calls = 8
	model := bucket.Limit{Rate: 2, Burst: 2}
	var upstream atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstream.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"usage":{"prompt_tokens":1000,"completion_tokens":10,"total_tokens":1010}}`)
	}))
	defer srv.Close()
	plan := bucket.Route(llmclient.KeyModel,
		map[string]bucket.Bucket{"gpt-4.1": bucket.NewLocal(model, bucket.WithClock(llmfixture.Frozen{}))},
		bucket.NewLocal(bucket.PerSecond(1000), bucket.WithClock(llmfixture.Frozen{})))
	hc := &http.Client{Transport: transport.New(nil, llmclient.OpenAI(plan), transport.WithMaxWait(100*time.Millisecond),
		transport.WithCost(func(*http.Request) bucket.Cost { return bucket.Cost{bucket.Requests: 1} }))}
	body := largeRequest("gpt-4.1")
	var wg sync.WaitGroup
	var refused atomic.Int64
	for range calls {
		wg.Go(func() {
			req, err := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(body))
			if !assert.NoError(t, err) {
				return
			}
			req.Header.Set("Authorization", "Bearer sk-a")
			resp, err := hc.Do(req)
			if errors.Is(err, bucket.ErrDeadline) {
				refused.Add(1)
				return
			}
			if assert.NoError(t, err) {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				assert.Equal(t, 200, resp.StatusCode)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(model.Burst), upstream.Load(), "calls that reached the upstream: gpt-4.1's burst, its clock standing")
	assert.Equal(t, int64(calls-model.Burst), refused.Load(), "calls refused at once")
}

// TestOpenAIPresetKeepsTheCapOfALargeRequest: the OpenAI preset reckons a
// call at its prompt and its max_tokens, as OpenAI counts it; the usage
// meter read the first 8 MiB of the body, lost the max_tokens of a 9 MiB
// request, and reconciled it to its usage (1,010 tokens, not 1,100).
func TestOpenAIPresetKeepsTheCapOfALargeRequest(t *testing.T) {
	srv := newRecorder(t, reply(200, `{"usage":{"prompt_tokens":1000,"completion_tokens":10,"total_tokens":1010}}`,
		"Content-Type", "application/json"))
	b := newBucket()
	resp, err := (&http.Client{Transport: transport.New(nil, llmclient.OpenAI(b))}).Post(
		srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(largeRequest("gpt-4.1")))
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	key := srv.URL + "/gpt-4.1"
	assert.Equal(t, float64(llmfixture.TPM-1000-100), b.Tokens(key)[bucket.Tokens], "the prompt and the cap, on the model's key")
}

// TestModelKeyDoesNotCopyALargeBody: ModelKey reads a 9 MiB body in
// 16 KiB at a time, and keeps no more of it: under 64 KiB allocated a
// call (the JSON decoder it used held 8 MiB).
func TestModelKeyDoesNotCopyALargeBody(t *testing.T) {
	req, err := http.NewRequest("POST", "https://api.openai.com/v1/chat/completions", strings.NewReader(largeRequest("gpt-4.1")))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk-a")
	require.Equal(t, "https://api.openai.com#"+transport.Fingerprint("sk-a")+"/gpt-4.1", llmclient.ModelKey(req))
	const runs = 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		llmclient.ModelKey(req)
	}
	runtime.ReadMemStats(&after)
	perCall := (after.TotalAlloc - before.TotalAlloc) / runs
	assert.Less(t, perCall, uint64(64<<10), "bytes allocated a call for a 9 MiB body")
	allocs := testing.AllocsPerRun(runs, func() { llmclient.ModelKey(req) })
	assert.LessOrEqual(t, allocs, 20.0, "allocations a call")
	t.Logf("%d bytes, %.0f allocations a call", perCall, allocs)
}

// TestModelKeyOfAnUnreadableBody: a call whose model cannot be read is
// keyed under UnknownModel, which bucket.Route charges to the class the
// plan gives it, and is logged, once a minute at most.
func TestModelKeyOfAnUnreadableBody(t *testing.T) {
	var logs strings.Builder
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	llmclient.ResetUnknownModelWarning()
	req, err := http.NewRequest("POST", "https://api.openai.com/v1/chat/completions", strings.NewReader(`{"model":"gpt-4.1"`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk-a")
	key := llmclient.ModelKey(req)
	assert.Equal(t, "https://api.openai.com#"+transport.Fingerprint("sk-a")+"/"+llmclient.UnknownModel, key)
	strict := bucket.NewLocal(bucket.PerSecond(1))
	plan := bucket.Route(llmclient.KeyModel, map[string]bucket.Bucket{llmclient.UnknownModel: strict}, bucket.NewLocal(bucket.PerSecond(1000)))
	assert.Same(t, strict, plan.For(key))
	assert.Contains(t, logs.String(), "level=WARN")
	assert.Contains(t, logs.String(), "host=api.openai.com")
	assert.NotContains(t, logs.String(), "sk-a")
	n := logs.Len()
	llmclient.ModelKey(req)
	assert.Equal(t, n, logs.Len(), "once a minute at most")
}
