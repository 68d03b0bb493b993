package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
)

// TestPassesRequestAndResponseThrough: the upstream sees the client's
// path after the prefix, its query, its own headers (the API key
// included) and body; the client gets the upstream's status, headers and
// body, and x-sluice-wait-ms.
func TestPassesRequestAndResponseThrough(t *testing.T) {
	var got *http.Request
	var gotBody []byte
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Clone(context.Background())
		gotBody, _ = io.ReadAll(r.Body)
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusTeapot)
		w.Write([]byte(`{"ok":true}`))
	}))
	defer up.Close()
	c := Config{Routes: []Route{{Prefix: "/openai", Upstream: up.URL + "/base", Preset: presetOpenAI,
		Limits: Limits{Requests: "100/s"}}}}
	p := start(t, c)

	req, _ := http.NewRequest(http.MethodPost, p.URL+"/openai/v1/chat/completions?x=1", strings.NewReader(chatBody(false)))
	req.Header.Set("Authorization", "Bearer sk-mine")
	req.Header.Set("OpenAI-Beta", "assistants=v2")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body := readAll(t, resp)

	assert.Equal(t, "/base/v1/chat/completions", got.URL.Path)
	assert.Equal(t, "x=1", got.URL.RawQuery)
	assert.Equal(t, "Bearer sk-mine", got.Header.Get("Authorization"))
	assert.Equal(t, "assistants=v2", got.Header.Get("OpenAI-Beta"))
	assert.Empty(t, got.Header.Get("X-Forwarded-For"), "the proxy adds no forwarding header")
	assert.Equal(t, chatBody(false), string(gotBody))
	assert.Equal(t, http.StatusTeapot, resp.StatusCode)
	assert.Equal(t, "yes", resp.Header.Get("X-Upstream"))
	assert.Equal(t, `{"ok":true}`, body)
	ms, err := strconv.Atoi(resp.Header.Get("X-Sluice-Wait-Ms"))
	require.NoError(t, err, "x-sluice-wait-ms")
	assert.Less(t, ms, 100, "a call with quota to spare waits no time")
}

// TestWaitHeaderSaysHowLongTheCallWaited: at 5 requests a second, burst
// 1, a call made right after another waits for its slot, 200 ms after the
// first's, less the first's duration; x-sluice-wait-ms says so, and never
// more than the call took.
func TestWaitHeaderSaysHowLongTheCallWaited(t *testing.T) {
	srv := llmtest.NewServer(llmtest.Config{})
	defer srv.Close()
	p := start(t, oneRoute(srv.AnthropicURL, presetOpenAI, Limits{Requests: "5/s burst 1"}))
	t0 := time.Now()
	readAll(t, post(t, p.URL+"/v1/chat/completions", chatBody(false)))
	first := time.Since(t0)
	t1 := time.Now()
	resp := post(t, p.URL+"/v1/chat/completions", chatBody(false))
	readAll(t, resp)
	second := time.Since(t1)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ms, err := strconv.Atoi(resp.Header.Get("X-Sluice-Wait-Ms"))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, ms, int((200*time.Millisecond-first)/time.Millisecond)-5, "waited for its slot (first call %v)", first)
	assert.LessOrEqual(t, ms, int(second/time.Millisecond)+1, "waited no longer than the call took")
}

// TestWaitPastMaxWaitAnswers429InTheProvidersShape: a call whose slot
// lies past the max wait is answered at once with a 429 its SDK retries
// by itself (retry-after-ms, retry-after, x-should-retry: true), in
// OpenAI's or Anthropic's error shape, and the upstream never sees it.
func TestWaitPastMaxWaitAnswers429InTheProvidersShape(t *testing.T) {
	srv := llmtest.NewServer(llmtest.Config{})
	defer srv.Close()
	c := Config{MaxWait: 100 * time.Millisecond, Routes: []Route{
		{Prefix: "/openai", Upstream: srv.URL, Preset: presetOpenAI, Limits: Limits{Requests: "1/min"}},
		{Prefix: "/anthropic", Upstream: srv.AnthropicURL, Preset: presetAnthropic, Limits: Limits{Requests: "1/min"}},
	}}
	p := start(t, c)
	anthropicBody := `{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"Hi"}]}`
	for _, tc := range []struct {
		path, body string
		check      func(t *testing.T, body map[string]any)
	}{
		{"/openai/chat/completions", chatBody(false), func(t *testing.T, b map[string]any) {
			e, _ := b["error"].(map[string]any)
			assert.Equal(t, "rate_limit_exceeded", e["code"])
			assert.Contains(t, e["message"], "max wait")
		}},
		{"/anthropic/v1/messages", anthropicBody, func(t *testing.T, b map[string]any) {
			assert.Equal(t, "error", b["type"])
			e, _ := b["error"].(map[string]any)
			assert.Equal(t, "rate_limit_error", e["type"])
		}},
	} {
		t.Run(tc.path, func(t *testing.T) {
			first := post(t, p.URL+tc.path, tc.body)
			readAll(t, first)
			require.Equal(t, http.StatusOK, first.StatusCode)
			before := srv.Stats().Accepted

			t0 := time.Now()
			resp := post(t, p.URL+tc.path, tc.body)
			raw := readAll(t, resp)
			took := time.Since(t0)
			require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, raw)
			assert.Less(t, took, time.Second, "answered at once, not after the max wait")
			ms, err := strconv.Atoi(resp.Header.Get("Retry-After-Ms"))
			require.NoError(t, err)
			assert.InDelta(t, 60_000, ms, 2_000, "the slot is a minute away at 1/min")
			assert.Equal(t, strconv.Itoa((ms+999)/1000), resp.Header.Get("Retry-After"))
			assert.Equal(t, "true", resp.Header.Get("X-Should-Retry"))
			assert.NotEmpty(t, resp.Header.Get("X-Sluice-Wait-Ms"))
			var b map[string]any
			require.NoError(t, json.Unmarshal([]byte(raw), &b))
			tc.check(t, b)
			assert.Equal(t, before, srv.Stats().Accepted, "the upstream never saw the call")
		})
	}
}

// TestBodyAboveCapAnswers413: a body one byte above max_body_bytes is
// answered 413 in the provider's shape, without reaching the upstream,
// whether the client announced its length or streamed it chunked; one at
// the cap passes.
func TestBodyAboveCapAnswers413(t *testing.T) {
	var seen atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		seen.Add(1)
		fmt.Fprintf(w, `{"n":%d}`, n)
	}))
	defer up.Close()
	c := oneRoute(up.URL, presetGeneric, Limits{})
	c.MaxBodyBytes = 1024
	p := start(t, c)

	resp := post(t, p.URL+"/v1/x", strings.Repeat("a", 1024))
	assert.Equal(t, `{"n":1024}`, readAll(t, resp))
	for _, chunked := range []bool{false, true} {
		var body io.Reader = bytes.NewReader(bytes.Repeat([]byte("a"), 1025))
		if chunked {
			body = io.MultiReader(body) // no length known: sent chunked
		}
		req, _ := http.NewRequest(http.MethodPost, p.URL+"/v1/x", body)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		raw := readAll(t, resp)
		assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "chunked %v", chunked)
		assert.Contains(t, raw, `"code":"request_too_large"`)
	}
	assert.Equal(t, int64(1), seen.Load(), "only the body at the cap reached the upstream")
}

// TestUnknownRouteAnswers404InTheProvidersShape: a path no route's prefix
// matches is answered 404, in the shape of the API its path looks like.
func TestUnknownRouteAnswers404InTheProvidersShape(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the upstream got %s", r.URL.Path)
	}))
	defer up.Close()
	p := start(t, Config{Routes: []Route{{Prefix: "/openai", Upstream: up.URL}}})
	for path, want := range map[string]string{
		"/v1/chat/completions": `{"error":{"code":"not_found","message":"sluice: no route for /v1/chat/completions","param":null,"type":"invalid_request_error"}}`,
		"/v1/messages":         `{"error":{"message":"sluice: no route for /v1/messages","type":"not_found_error"},"type":"error"}`,
		"/v1beta/models/gemini-2.0-flash:generateContent": `{"error":{"code":404,"message":"sluice: no route for /v1beta/models/gemini-2.0-flash:generateContent","status":"NOT_FOUND"}}`,
		"/openaix/chat": `{"error":{"code":"not_found","message":"sluice: no route for /openaix/chat","param":null,"type":"invalid_request_error"}}`,
	} {
		resp := post(t, p.URL+path, "{}")
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, path)
		assert.JSONEq(t, want, readAll(t, resp), path)
	}
}

// TestMalformedJSONPassesThroughChargedOneRequest: the proxy does not
// judge a body: one that is not JSON reaches the upstream, whose answer
// (llmtest's 400) the client gets as it is, and it is charged one request
// and no tokens, on the key of a model it cannot read (llmclient.UnknownModel).
func TestMalformedJSONPassesThroughChargedOneRequest(t *testing.T) {
	srv := llmtest.NewServer(llmtest.Config{})
	defer srv.Close()
	p := start(t, oneRoute(srv.URL, presetOpenAI, Limits{Requests: "1/h burst 10", Tokens: "1000/h"}))
	const malformed = `{"model": "gpt-test", "messages": [`
	resp := post(t, p.URL+"/chat/completions", malformed)
	raw := readAll(t, resp)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, raw, "Invalid request", "the upstream's own answer")
	assert.Equal(t, int64(1), srv.Stats().Invalid)

	key := bodyKey(srv.URL, "sk-test", malformed)
	assert.True(t, strings.HasSuffix(key, "/"+llmclient.UnknownModel), key)
	left := p.localTokens(t, "/", key)
	assert.InDelta(t, 9, left[bucket.Requests], 0.01, "charged one request")
	assert.InDelta(t, 1000, left[bucket.Tokens], 0.01, "and no tokens")
}

// upstreamKey is the key the OpenAI preset charges a call to upstream's
// chat completions with apiKey and model.
func upstreamKey(t testing.TB, upstream, apiKey, model string) string {
	body := "{}"
	if model != "" {
		body = `{"model":"` + model + `"}`
	}
	return bodyKey(upstream, apiKey, body)
}

// bodyKey is the key the OpenAI preset charges a call to upstream's chat
// completions with apiKey and body.
func bodyKey(upstream, apiKey, body string) string {
	r := httptest.NewRequest(http.MethodPost, upstream+"/chat/completions", strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+apiKey)
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
	return llmclient.ModelKey(r)
}

// sseUpstream streams n events, gap apart, recording when each is sent
// and when the request's context ended.
type sseUpstream struct {
	n     int
	gap   time.Duration
	ended chan time.Time

	mu   sync.Mutex
	sent []time.Time // of the last request's events
}

// sendTimes returns when each event of the last request was sent.
func (u *sseUpstream) sendTimes() []time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]time.Time(nil), u.sent...)
}

func (u *sseUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	defer func() { u.ended <- time.Now() }()
	u.mu.Lock()
	u.sent = u.sent[:0]
	u.mu.Unlock()
	for i := range u.n {
		if i > 0 && u.gap > 0 {
			select {
			case <-time.After(u.gap):
			case <-r.Context().Done():
				return
			}
		}
		u.mu.Lock()
		u.sent = append(u.sent, time.Now())
		u.mu.Unlock()
		if _, err := fmt.Fprintf(w, "data: {\"i\":%d,\"pad\":\"%s\"}\n\n", i, strings.Repeat("x", i%50)); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
}

// TestStreamsEventByEvent: events the upstream sends 50 ms apart reach
// the client as far apart, within 5 ms (the median of the differences
// between each gap at arrival and the same gap at sending), each before
// the next is sent (the median lag is under half the gap): the proxy
// flushes every event.
func TestStreamsEventByEvent(t *testing.T) {
	u := &sseUpstream{n: 21, gap: 50 * time.Millisecond, ended: make(chan time.Time, 1)}
	up := httptest.NewServer(u)
	defer up.Close()
	p := start(t, oneRoute(up.URL, presetOpenAI, Limits{Requests: "100/s"}))
	resp := post(t, p.URL+"/chat/completions", chatBody(true))
	defer resp.Body.Close()
	var arrived []time.Time
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			arrived = append(arrived, time.Now())
		}
	}
	<-u.ended
	require.Len(t, arrived, u.n)
	var gaps, offs, lags []time.Duration
	sent := u.sendTimes()
	for i := range arrived {
		lags = append(lags, arrived[i].Sub(sent[i]))
		if i > 0 {
			gap := arrived[i].Sub(arrived[i-1])
			gaps = append(gaps, gap)
			offs = append(offs, (gap - sent[i].Sub(sent[i-1])).Abs())
		}
	}
	t.Logf("gaps at arrival: median %v; off their sending by %v at the median; lag %v at the median", median(gaps), median(offs), median(lags))
	assert.LessOrEqual(t, median(offs), 5*time.Millisecond, "gaps at arrival vs at sending: %v", offs)
	assert.Less(t, median(lags), u.gap/2, "lag of an event behind its sending: %v", lags)
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// TestStreamOf5000EventsArrivesByteForByte: 5,000 events, as fast as the
// upstream writes them, arrive exactly as sent.
func TestStreamOf5000EventsArrivesByteForByte(t *testing.T) {
	var sent bytes.Buffer
	u := &sseUpstream{n: 5000, ended: make(chan time.Time, 1)}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.ServeHTTP(&teeWriter{w, &sent}, r)
	}))
	defer up.Close()
	p := start(t, oneRoute(up.URL, presetOpenAI, Limits{Requests: "100/s"}))
	resp := post(t, p.URL+"/chat/completions", chatBody(true))
	got := readAll(t, resp)
	<-u.ended
	require.Equal(t, 5000, strings.Count(got, "\n\n"))
	assert.Equal(t, sha256.Sum256(sent.Bytes()), sha256.Sum256([]byte(got)), "%d bytes sent, %d received", sent.Len(), len(got))
}

// teeWriter copies what a handler writes.
type teeWriter struct {
	http.ResponseWriter
	copy *bytes.Buffer
}

func (w *teeWriter) Write(p []byte) (int, error) {
	w.copy.Write(p)
	return w.ResponseWriter.Write(p)
}

func (w *teeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// TestStreamOutlivesEveryTimeoutButTheDrain: with the write, read-header
// and idle timeouts at 100 ms, a stream of 1.2 s arrives whole, on a
// connection whose previous response, not a stream, had a write deadline.
func TestStreamOutlivesEveryTimeoutButTheDrain(t *testing.T) {
	u := &sseUpstream{n: 13, gap: 100 * time.Millisecond, ended: make(chan time.Time, 1)}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/json") {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"ok":true}`))
			return
		}
		u.ServeHTTP(w, r)
	}))
	defer up.Close()
	c := oneRoute(up.URL, presetOpenAI, Limits{Requests: "100/s"})
	c.WriteTimeout, c.ReadHeaderTimeout, c.IdleTimeout = 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
	p := start(t, c)
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	var conns atomic.Int64
	for _, path := range []string{"/json", "/chat/completions"} {
		req, _ := http.NewRequest(http.MethodPost, p.URL+path, strings.NewReader(chatBody(path != "/json")))
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			ConnectStart: func(string, string) { conns.Add(1) }}))
		resp, err := client.Do(req)
		require.NoError(t, err)
		got := readAll(t, resp)
		if path == "/json" {
			assert.Equal(t, `{"ok":true}`, got)
			continue
		}
		<-u.ended
		assert.Equal(t, 13, strings.Count(got, "data: "), "every event of the stream")
	}
	assert.Equal(t, int64(1), conns.Load(), "both calls on one connection")
}

// TestClientGoneMidStreamCancelsUpstream: a client that leaves after two
// events cancels the upstream's request within a second; the call's
// charge stands as the library settles a stream whose usage never came
// (one request, its estimate of tokens), and nothing more is taken.
func TestClientGoneMidStreamCancelsUpstream(t *testing.T) {
	u := &sseUpstream{n: 200, gap: 50 * time.Millisecond, ended: make(chan time.Time, 1)}
	up := httptest.NewServer(u)
	defer up.Close()
	p := start(t, oneRoute(up.URL, presetOpenAI, Limits{Requests: "1/h burst 10", Tokens: "1000/h burst 100000"}))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/chat/completions", strings.NewReader(chatBody(true)))
	req.Header.Set("Authorization", "Bearer sk-test")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	br := bufio.NewReader(resp.Body)
	for range 4 { // two events, each a data line and a blank one
		_, err := br.ReadString('\n')
		require.NoError(t, err)
	}
	gone := time.Now()
	cancel()
	resp.Body.Close()
	select {
	case ended := <-u.ended:
		assert.Less(t, ended.Sub(gone), time.Second, "the upstream's request ended after the client left")
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream's request still runs 5 s after the client left")
	}
	key := upstreamKey(t, up.URL, "sk-test", "gpt-test")
	est := float64(llmclient.Estimate(llmclient.ChatRequest{MaxTokens: 16, Messages: []llmclient.Message{{Role: "user", Content: "Hello there"}}}))
	left := p.localTokens(t, "/", key)
	assert.InDelta(t, 9, left[bucket.Requests], 0.01, "one request charged")
	assert.InDelta(t, 100000-est, left[bucket.Tokens], 1, "its estimate of tokens charged, once")
}

// TestClientGoneWhileWaitingGetsItsReservationBack: a client that leaves
// while its call waits for the quota takes nothing: the bucket's tokens
// are those it had before the call, not a request fewer, and the upstream
// never sees it.
func TestClientGoneWhileWaitingGetsItsReservationBack(t *testing.T) {
	srv := llmtest.NewServer(llmtest.Config{})
	defer srv.Close()
	c := oneRoute(srv.URL, presetOpenAI, Limits{Requests: "1/h burst 1", Tokens: "1000/h burst 100000"})
	c.MaxWait = 2 * time.Hour // the next slot, an hour away, is waited for
	p := start(t, c)
	readAll(t, post(t, p.URL+"/chat/completions", chatBody(false)))
	key := upstreamKey(t, srv.URL, "sk-test", "gpt-test")
	before := p.localTokens(t, "/", key)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/chat/completions", strings.NewReader(chatBody(false)))
	req.Header.Set("Authorization", "Bearer sk-test")
	_, err := http.DefaultClient.Do(req)
	require.Error(t, err, "the client gave up while the call waited")
	assert.Eventually(t, func() bool {
		return p.localTokens(t, "/", key)[bucket.Requests] > before[bucket.Requests]-0.5
	}, 2*time.Second, 10*time.Millisecond, "the reservation was given back")
	after := p.localTokens(t, "/", key)
	assert.InDelta(t, before[bucket.Requests], after[bucket.Requests], 0.01, "requests before and after the call")
	assert.InDelta(t, before[bucket.Tokens], after[bucket.Tokens], 1, "tokens before and after the call")
	assert.Equal(t, int64(1), srv.Stats().Accepted, "the upstream saw only the first call")
}

// TestGzipAnswerIsReconciled: a client that accepts gzip (as the Node and
// Python SDKs do) from an upstream that sends it still has its call
// reconciled with the usage in the body: the proxy asks for gzip itself
// and reads the body decoded, which the client gets. Its tokens are the
// usage's 21 (prompt 5, completion 16: the cap, as OpenAI counts),
// whatever the estimate was.
func TestGzipAnswerIsReconciled(t *testing.T) {
	const usage = `{"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":16,"total_tokens":21}}`
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Write([]byte(usage))
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		zw.Write([]byte(usage))
		zw.Close()
	}))
	defer up.Close()
	p := start(t, oneRoute(up.URL, presetOpenAI, Limits{Requests: "1/h burst 10", Tokens: "1000/h burst 100000"}))
	req, _ := http.NewRequest(http.MethodPost, p.URL+"/chat/completions", strings.NewReader(chatBody(false)))
	req.Header.Set("Authorization", "Bearer sk-test")
	req.Header.Set("Accept-Encoding", "gzip, deflate, br")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body := readAll(t, resp)
	assert.Empty(t, resp.Header.Get("Content-Encoding"), "the client gets the body decoded")
	assert.Equal(t, usage, body)
	left := p.localTokens(t, "/", upstreamKey(t, up.URL, "sk-test", "gpt-test"))
	assert.InDelta(t, 100000-21, left[bucket.Tokens], 1, "charged the usage's tokens")
}

// TestRetryAfterOfNeverIsBounded: a bucket's "never" (a RetryAfter of
// math.MaxInt64) overflowed into a negative retry-after-ms and
// retry-after; it is asked as maxRetryAfter, a day.
func TestRetryAfterOfNeverIsBounded(t *testing.T) {
	rec := httptest.NewRecorder()
	apiError{http.StatusTooManyRequests, kindRateLimit, "sluice: never"}.write(rec, shapeOpenAI, time.Duration(math.MaxInt64))
	assert.Equal(t, "86400000", rec.Header().Get("Retry-After-Ms"))
	assert.Equal(t, "86400", rec.Header().Get("Retry-After"))
	assert.Equal(t, "true", rec.Header().Get("X-Should-Retry"))
}
