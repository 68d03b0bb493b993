package proxy

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/llmclient/llmtest"
)

func get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	return resp.StatusCode, readAll(t, resp)
}

// TestDrainLetsOpenStreamsFinish: once the drain starts, /readyz answers
// 503 and new connections are refused, while the 5 streams already open
// (1.2 s each) complete whole; Serve then returns nil.
func TestDrainLetsOpenStreamsFinish(t *testing.T) {
	u := &sseUpstream{n: 13, gap: 100 * time.Millisecond, ended: make(chan time.Time, 5)}
	upSrv := newServer(t, u)
	p := start(t, oneRoute(upSrv, presetOpenAI, Limits{Requests: "100/s"}))
	status, _ := get(t, p.Admin+"/readyz")
	require.Equal(t, http.StatusOK, status)

	const streams = 5
	bodies := make(chan string, streams)
	for range streams {
		resp := post(t, p.URL+"/chat/completions", chatBody(true))
		go func() { b, _ := io.ReadAll(resp.Body); resp.Body.Close(); bodies <- string(b) }()
	}
	done := p.drain()
	time.Sleep(50 * time.Millisecond)
	status, body := get(t, p.Admin+"/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.Contains(t, body, "draining")
	_, err := http.Post(p.URL+"/chat/completions", "application/json", strings.NewReader(chatBody(false)))
	assert.Error(t, err, "a new connection during the drain is refused")
	for range streams {
		assert.Equal(t, 13, strings.Count(<-bodies, "data: "), "a stream open at the drain completes")
	}
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the drain")
	}
	done <- nil // for the cleanup
}

// TestDrainTimeoutCutsStreams: a stream longer than the drain timeout is
// cut at it, and Serve says so.
func TestDrainTimeoutCutsStreams(t *testing.T) {
	u := &sseUpstream{n: 100, gap: 100 * time.Millisecond, ended: make(chan time.Time, 1)}
	c := oneRoute(newServer(t, u), presetOpenAI, Limits{Requests: "100/s"})
	c.DrainTimeout = 300 * time.Millisecond
	p := start(t, c)
	resp := post(t, p.URL+"/chat/completions", chatBody(true))
	defer resp.Body.Close()
	t0 := time.Now()
	done := p.drain()
	err := <-done
	done <- nil
	assert.ErrorIs(t, err, ErrDrainTimeout)
	assert.Less(t, time.Since(t0), 3*time.Second)
}

// TestReadyzReportsMisconfiguredRedis: against a Redis that evicts keys
// (maxmemory-policy allkeys-lru), which would reset buckets to full,
// /readyz answers 503 and names the cause; /healthz still answers 200.
func TestReadyzReportsMisconfiguredRedis(t *testing.T) {
	rs := redistest.Own(t, "--maxmemory-policy", "allkeys-lru")
	srv := llmtest.NewServer(llmtest.Config{})
	defer srv.Close()
	c := oneRoute(srv.URL, presetOpenAI, Limits{Requests: "100/s"})
	c.Redis.URL = "redis://" + rs.Addr
	p := start(t, c)
	require.Eventually(t, func() bool {
		status, _ := get(t, p.Admin+"/readyz")
		return status == http.StatusServiceUnavailable
	}, 10*time.Second, 50*time.Millisecond)
	_, body := get(t, p.Admin+"/readyz")
	assert.Contains(t, body, "maxmemory-policy")
	status, _ := get(t, p.Admin+"/healthz")
	assert.Equal(t, http.StatusOK, status)
}

// TestMetricsServeTheLibrarysFamilies: after a call, /metrics has the
// bucket's and the transport's families.
func TestMetricsServeTheLibrarysFamilies(t *testing.T) {
	rs := redistest.Own(t)
	srv := llmtest.NewServer(llmtest.Config{})
	defer srv.Close()
	c := oneRoute(srv.URL, presetOpenAI, Limits{Requests: "100/s", Tokens: "100000/min"})
	c.Redis.URL = "redis://" + rs.Addr
	p := start(t, c)
	resp := post(t, p.URL+"/chat/completions", chatBody(false))
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	status, body := get(t, p.Admin+"/metrics")
	require.Equal(t, http.StatusOK, status)
	for _, family := range []string{"sluice_bucket_decisions_total", "sluice_bucket_tokens_charged_total",
		"sluice_transport_attempts_total", "sluice_transport_wait_duration_seconds"} {
		assert.Contains(t, body, family)
	}
	assert.Contains(t, body, `route="/"`)
	status, _ = get(t, p.Admin+"/readyz")
	assert.Equal(t, http.StatusOK, status, "a well configured Redis is ready")
}

// newServer serves h on loopback until t ends, and returns its URL.
func newServer(t testing.TB, h http.Handler) string {
	srv := &http.Server{Handler: h}
	ln := listen(t)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// listen listens on a free loopback port.
func listen(t testing.TB) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return ln
}

// TestLogsHoldNoSecret: at debug level, the proxy's and the library's logs
// of calls that succeed, wait past the max wait and fail upstream hold
// neither the API key of the Authorization header nor one in the query.
func TestLogsHoldNoSecret(t *testing.T) {
	srv := llmtest.NewServer(llmtest.Config{})
	defer srv.Close()
	var logs syncBuffer
	c := Config{MaxWait: 50 * time.Millisecond, Routes: []Route{
		{Prefix: "/ok", Upstream: srv.URL, Limits: Limits{Requests: "1/min"}},
		{Prefix: "/down", Upstream: "http://127.0.0.1:1", Preset: presetGemini, Limits: Limits{Requests: "100/s"}}}}
	p := startLogging(t, c, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	for _, path := range []string{"/ok/chat/completions", "/ok/chat/completions", "/down/v1beta/models/g:generateContent?key=AIza-query-secret"} {
		req, _ := http.NewRequest(http.MethodPost, p.URL+path, strings.NewReader(chatBody(false)))
		req.Header.Set("Authorization", "Bearer sk-header-secret")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		readAll(t, resp)
	}
	out := logs.String()
	require.Contains(t, out, `"status":429`, "the logs saw the calls")
	require.Contains(t, out, `"status":502`)
	assert.NotContains(t, out, "sk-header-secret")
	assert.NotContains(t, out, "AIza-query-secret")
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
