package proxy

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
)

// running is a Server of a test's, serving on loopback.
type running struct {
	srv   *Server
	URL   string // http://127.0.0.1:port
	Admin string // http://127.0.0.1:port
	stop  context.CancelFunc
	done  chan error
}

// start serves c on free loopback ports until t ends (or drain is called).
func start(t testing.TB, c Config) *running {
	t.Helper()
	return startLogging(t, c, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// startLogging is start with the proxy's logs sent to log.
func startLogging(t testing.TB, c Config, log *slog.Logger) *running {
	t.Helper()
	srv, err := NewServer(c, log)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	adm, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	r := &running{srv: srv, URL: "http://" + ln.Addr().String(), Admin: "http://" + adm.Addr().String(),
		stop: stop, done: make(chan error, 1)}
	go func() { r.done <- srv.Serve(ctx, ln, adm) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-r.done:
		case <-time.After(time.Minute):
			t.Error("the proxy did not stop")
		}
	})
	return r
}

// drain starts the drain (as SIGTERM does) and returns Serve's result
// channel.
func (r *running) drain() chan error {
	r.stop()
	return r.done
}

// oneRoute is a Config with one route, prefix "/", to upstream.
func oneRoute(upstream, preset string, l Limits) Config {
	return Config{Routes: []Route{{Prefix: "/", Upstream: upstream, Preset: preset, Limits: l}}}
}

// post sends body to url as JSON with an API key, and returns the response.
func post(t testing.TB, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-test")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	return resp
}

// readAll reads and closes resp's body.
func readAll(t testing.TB, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// localTokens returns what the Local bucket of the route serving path has
// left of key's quota.
func (r *running) localTokens(t testing.TB, path, key string) bucket.Cost {
	t.Helper()
	l, ok := r.srv.proxy.match(path).bucket.(*bucket.Local)
	require.True(t, ok, "the route's bucket is a %T, not a *bucket.Local", r.srv.proxy.match(path).bucket)
	return l.Tokens(key)
}

// chatBody is an OpenAI chat completion request.
func chatBody(stream bool) string {
	s := `{"model":"gpt-test","max_tokens":16,"messages":[{"role":"user","content":"Hello there"}]`
	if stream {
		s += `,"stream":true,"stream_options":{"include_usage":true}`
	}
	return s + "}"
}
