package transport_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// do sends method to the script through a Transport with a fake clock.
func do(t *testing.T, s *script, method string, hdr map[string]string, opts ...transport.Option) (*http.Response, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	opts = append([]transport.Option{transport.WithTestClock(clk.Now, clk.Sleep)}, opts...)
	tr := transport.New(nil, opts...)
	var body io.Reader
	if method == http.MethodPost || method == http.MethodPut {
		body = strings.NewReader(`{"q":1}`)
	}
	req, err := http.NewRequest(method, s.URL+"/v1/x", body)
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp, clk
}

func TestRetryRules(t *testing.T) {
	quota := step{status: 429, body: `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`}
	rate := step{status: 429, body: `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`}
	tests := []struct {
		name     string
		method   string
		hdr      map[string]string
		steps    []step
		retry    transport.Retry
		attempts int
		status   int
	}{
		{"429 POST", "POST", nil, []step{status(429)}, transport.Retry{}, 2, 200},
		{"429 rate limit body", "POST", nil, []step{rate}, transport.Retry{}, 2, 200},
		{"503 POST", "POST", nil, []step{status(503)}, transport.Retry{}, 2, 200},
		{"529 POST", "POST", nil, []step{status(529)}, transport.Retry{}, 2, 200},
		{"408 GET", "GET", nil, []step{status(408)}, transport.Retry{}, 2, 200},
		{"500 GET", "GET", nil, []step{status(500)}, transport.Retry{}, 2, 200},
		{"502 GET", "GET", nil, []step{status(502)}, transport.Retry{}, 2, 200},
		{"504 GET", "GET", nil, []step{status(504)}, transport.Retry{}, 2, 200},
		{"500 HEAD", "HEAD", nil, []step{status(500)}, transport.Retry{}, 2, 200},
		{"500 OPTIONS", "OPTIONS", nil, []step{status(500)}, transport.Retry{}, 2, 200},
		{"500 PUT", "PUT", nil, []step{status(500)}, transport.Retry{}, 2, 200},
		{"500 DELETE", "DELETE", nil, []step{status(500)}, transport.Retry{}, 2, 200},
		{"408 POST", "POST", nil, []step{status(408)}, transport.Retry{}, 1, 408},
		{"500 POST", "POST", nil, []step{status(500)}, transport.Retry{}, 1, 500},
		{"502 POST", "POST", nil, []step{status(502)}, transport.Retry{}, 1, 502},
		{"504 PATCH", "PATCH", nil, []step{status(504)}, transport.Retry{}, 1, 504},
		{"500 POST Idempotency-Key", "POST", map[string]string{"Idempotency-Key": "k1"}, []step{status(500)}, transport.Retry{}, 2, 200},
		{"500 POST X-Idempotency-Key", "POST", map[string]string{"X-Idempotency-Key": "k1"}, []step{status(500)}, transport.Retry{}, 2, 200},
		{"500 POST opted in", "POST", nil, []step{status(500)}, transport.Retry{NonIdempotent: true}, 2, 200},
		{"501 GET", "GET", nil, []step{status(501)}, transport.Retry{}, 1, 501},
		{"505 GET", "GET", nil, []step{status(505)}, transport.Retry{}, 1, 505},
		{"400 GET", "GET", nil, []step{status(400)}, transport.Retry{}, 1, 400},
		{"401 GET", "GET", nil, []step{status(401)}, transport.Retry{}, 1, 401},
		{"404 GET", "GET", nil, []step{status(404)}, transport.Retry{}, 1, 404},
		{"409 GET", "GET", nil, []step{status(409)}, transport.Retry{}, 1, 409},
		{"422 GET", "GET", nil, []step{status(422)}, transport.Retry{}, 1, 422},
		{"200 GET", "GET", nil, []step{status(200)}, transport.Retry{}, 1, 200},
		{"x-should-retry true on 400 POST", "POST", nil, []step{status(400, "X-Should-Retry", "true")}, transport.Retry{}, 2, 200},
		{"x-should-retry true on 500 POST", "POST", nil, []step{status(500, "X-Should-Retry", "true")}, transport.Retry{}, 2, 200},
		{"x-should-retry false on 503", "GET", nil, []step{status(503, "X-Should-Retry", "false")}, transport.Retry{}, 1, 503},
		{"x-should-retry false on 429", "GET", nil, []step{status(429, "X-Should-Retry", "false")}, transport.Retry{}, 1, 429},
		{"x-should-retry true on 200", "GET", nil, []step{status(200, "X-Should-Retry", "true")}, transport.Retry{}, 1, 200},
		{"429 insufficient_quota", "POST", nil, []step{quota}, transport.Retry{}, 1, 429},
		{"max attempts", "GET", nil, []step{status(503), status(503), status(503), status(503)}, transport.Retry{}, 3, 503},
		{"max attempts 5", "GET", nil, []step{status(503), status(503), status(503), status(503)}, transport.Retry{MaxAttempts: 5}, 5, 200},
		{"retries disabled", "GET", nil, []step{status(503)}, transport.Retry{MaxAttempts: 1}, 1, 503},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(tt.steps...)
			defer s.Close()
			resp, _ := do(t, s, tt.method, tt.hdr, transport.WithRetry(tt.retry))
			assert.Equal(t, tt.status, resp.StatusCode)
			assert.EqualValues(t, tt.attempts, s.hits.Load(), "attempts")
		})
	}
}

func TestInsufficientQuotaBodyIntact(t *testing.T) {
	body := `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}` +
		strings.Repeat(" ", 10000) // longer than what is looked at
	s := newScript(step{status: 429, body: body, header: map[string]string{"Retry-After": "1"}})
	defer s.Close()
	resp, clk := do(t, s, "POST", nil)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, body, string(got))
	assert.EqualValues(t, 1, s.hits.Load())
	assert.Empty(t, clk.Sleeps())
}

func TestRetryAfterForms(t *testing.T) {
	clk0 := newFakeClock().Now()
	tests := []struct {
		name  string
		hdr   []string
		delay time.Duration // 0: no retry
	}{
		{"seconds", []string{"Retry-After", "2"}, 2 * time.Second},
		{"fractional seconds", []string{"Retry-After", "0.25"}, 250 * time.Millisecond},
		{"zero seconds", []string{"Retry-After", "0"}, 0},
		{"HTTP-date", []string{"Retry-After", clk0.Add(3 * time.Second).UTC().Format(http.TimeFormat)}, 3 * time.Second},
		{"HTTP-date in the past", []string{"Retry-After", clk0.Add(-time.Hour).UTC().Format(http.TimeFormat)}, 0},
		{"retry-after-ms", []string{"Retry-After-Ms", "1500"}, 1500 * time.Millisecond},
		{"retry-after-ms wins", []string{"Retry-After", "5", "Retry-After-Ms", "250"}, 250 * time.Millisecond},
		{"invalid: backoff", []string{"Retry-After", "soon"}, 500 * time.Millisecond},
		{"negative: backoff", []string{"Retry-After", "-3"}, 500 * time.Millisecond},
		{"invalid ms, valid seconds", []string{"Retry-After-Ms", "x", "Retry-After", "1"}, time.Second},
		{"no header: backoff", nil, 500 * time.Millisecond},
		{"largest honoured", []string{"Retry-After", "60"}, 60 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(status(429, tt.hdr...))
			defer s.Close()
			resp, clk := do(t, s, "POST", nil, transport.WithRetry(transport.Retry{Jitter: -1}))
			assert.Equal(t, 200, resp.StatusCode)
			assert.EqualValues(t, 2, s.hits.Load())
			sleeps := clk.Sleeps()
			require.NotEmpty(t, sleeps)
			assert.Equal(t, tt.delay, sleeps[0])
			for _, d := range sleeps[1:] { // a pause of the key already served
				assert.Zero(t, d)
			}
		})
	}
	t.Run("longer than MaxRetryAfter is returned", func(t *testing.T) {
		s := newScript(status(429, "Retry-After", "61"))
		defer s.Close()
		resp, clk := do(t, s, "POST", nil)
		assert.Equal(t, 429, resp.StatusCode)
		assert.EqualValues(t, 1, s.hits.Load())
		assert.Empty(t, clk.Sleeps())
	})
	t.Run("MaxRetryAfter raised", func(t *testing.T) {
		s := newScript(status(503, "Retry-After", "90"))
		defer s.Close()
		resp, clk := do(t, s, "POST", nil, transport.WithRetry(transport.Retry{MaxRetryAfter: 2 * time.Minute, Jitter: -1}))
		assert.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, 90*time.Second, clk.Sleeps()[0])
	})
}

func TestBackoffCap(t *testing.T) {
	s := newScript(status(500), status(500), status(500), status(500), status(500))
	defer s.Close()
	resp, clk := do(t, s, "GET", nil, transport.WithRetry(transport.Retry{
		MaxAttempts: 6, InitialInterval: time.Second, Multiplier: 3, MaxInterval: 4 * time.Second, Jitter: -1,
	}))
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, []time.Duration{time.Second, 3 * time.Second, 4 * time.Second, 4 * time.Second, 4 * time.Second}, clk.Sleeps())
}

func TestBackoffDefaults(t *testing.T) {
	s := newScript(status(503), status(503))
	defer s.Close()
	resp, clk := do(t, s, "GET", nil, transport.WithRetry(transport.Retry{Jitter: -1}))
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, []time.Duration{500 * time.Millisecond, time.Second}, clk.Sleeps())
}

func TestJitterBounds(t *testing.T) {
	t.Run("drawn values", func(t *testing.T) {
		draws := []float64{0, 0.5, 0.999999}
		var i atomic.Int32
		rnd := func() float64 { return draws[int(i.Add(1)-1)%len(draws)] }
		s := newScript(status(503), status(503), status(503, "Retry-After", "2"))
		defer s.Close()
		resp, clk := do(t, s, "GET", nil, transport.WithTestRand(rnd), transport.WithRetry(transport.Retry{
			MaxAttempts: 4, InitialInterval: time.Second, Multiplier: 1, Jitter: 0.5,
		}))
		assert.Equal(t, 200, resp.StatusCode)
		sl := clk.Sleeps()
		require.GreaterOrEqual(t, len(sl), 3)
		assert.Equal(t, time.Second, sl[0])
		assert.Equal(t, 1250*time.Millisecond, sl[1])
		assert.InDelta(t, float64(3*time.Second), float64(sl[2]), float64(time.Microsecond)) // 2s + 0.5·2s·0.999999
	})
	t.Run("random, positive only", func(t *testing.T) {
		steps := make([]step, 0, 60)
		for range 30 {
			steps = append(steps, status(503), status(429, "Retry-After", "2"))
		}
		s := newScript(steps...)
		defer s.Close()
		resp, clk := do(t, s, "GET", nil, transport.WithRetry(transport.Retry{
			MaxAttempts: 61, InitialInterval: time.Second, Multiplier: 1, // default Jitter 0.2
		}))
		assert.Equal(t, 200, resp.StatusCode)
		var backoffs, afters []time.Duration
		for _, d := range clk.Sleeps() {
			switch {
			case d == 0: // a pause already served
			case d < 1500*time.Millisecond:
				backoffs = append(backoffs, d)
			default:
				afters = append(afters, d)
			}
		}
		require.Len(t, backoffs, 30)
		require.Len(t, afters, 30)
		check := func(ds []time.Duration, base time.Duration) {
			lo, hi := ds[0], ds[0]
			for _, d := range ds {
				assert.GreaterOrEqual(t, d, base)
				assert.LessOrEqual(t, d, base+base/5)
				lo, hi = min(lo, d), max(hi, d)
			}
			assert.Greater(t, hi-lo, base/50, "delays are spread")
		}
		check(backoffs, time.Second)
		check(afters, 2*time.Second)
	})
}

func TestDeadlineFailFast(t *testing.T) {
	for _, tt := range []struct {
		name string
		step step
	}{
		{"Retry-After past the deadline", status(503, "Retry-After", "10")},
		{"backoff past the deadline", status(502)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(tt.step)
			defer s.Close()
			tr := transport.New(nil, transport.WithRetry(transport.Retry{InitialInterval: 5 * time.Second}))
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", s.URL, nil)
			start := time.Now()
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			assert.Less(t, time.Since(start), time.Second, "returned at once")
			assert.Equal(t, tt.step.status, resp.StatusCode)
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, tt.step.body, string(b), "returned unread")
			assert.EqualValues(t, 1, s.hits.Load())
		})
	}
}

func TestBodyReplay(t *testing.T) {
	const payload = `{"model":"gpt","messages":[{"role":"user","content":"hi"}]}`
	s := newScript(status(503), status(429))
	defer s.Close()
	clk := newFakeClock()
	tr := transport.New(nil, transport.WithTestClock(clk.Now, clk.Sleep))
	req, err := http.NewRequest("POST", s.URL, bytes.NewReader([]byte(payload)))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, []string{payload, payload, payload}, s.Bodies())
}

func TestNoRetryWithoutGetBody(t *testing.T) {
	s := newScript(status(503), status(503))
	defer s.Close()
	clk := newFakeClock()
	tr := transport.New(nil, transport.WithTestClock(clk.Now, clk.Sleep))
	body := &closeTracker{Reader: strings.NewReader("payload")}
	req, err := http.NewRequest("POST", s.URL, body)
	require.NoError(t, err)
	require.Nil(t, req.GetBody)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, 503, resp.StatusCode)
	assert.EqualValues(t, 1, s.hits.Load())
	assert.Equal(t, []string{"payload"}, s.Bodies())
	assert.Empty(t, clk.Sleeps())
	assert.Eventually(t, body.closed.Load, time.Second, time.Millisecond, "the body is closed")
}

func TestGetBodyError(t *testing.T) {
	s := newScript(status(503), status(503))
	defer s.Close()
	clk := newFakeClock()
	tr := transport.New(nil, transport.WithTestClock(clk.Now, clk.Sleep))
	req, _ := http.NewRequest("POST", s.URL, strings.NewReader("payload"))
	calls := 0
	req.GetBody = func() (io.ReadCloser, error) {
		calls++
		return nil, errors.New("cannot rewind")
	}
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, 503, resp.StatusCode, "the previous response, kept in memory")
	b, _ := io.ReadAll(resp.Body)
	assert.Equal(t, status(503).body, string(b))
	assert.Equal(t, 1, calls)
	assert.EqualValues(t, 1, s.hits.Load())
}

type ctxKey struct{}

func TestRequestUnchanged(t *testing.T) {
	s := newScript(status(503), status(500))
	defer s.Close()
	clk := newFakeClock()
	tr := transport.New(nil, transport.WithTestClock(clk.Now, clk.Sleep))
	ctx := context.WithValue(context.Background(), ctxKey{}, "v")
	req, err := http.NewRequestWithContext(ctx, "PUT", s.URL+"/a/b?x=1", strings.NewReader("payload"))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk-test")
	req.Header.Add("X-Multi", "1")
	req.Header.Add("X-Multi", "2")
	var (
		header = req.Header.Clone()
		url    = req.URL.String()
		urlPtr = req.URL
		body   = req.Body
		length = req.ContentLength
		host   = req.Host
		getb   = req.GetBody
	)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.EqualValues(t, 3, s.hits.Load())

	assert.Equal(t, "PUT", req.Method)
	assert.Equal(t, header, req.Header)
	assert.Same(t, urlPtr, req.URL)
	assert.Equal(t, url, req.URL.String())
	assert.Equal(t, body, req.Body)
	assert.Equal(t, length, req.ContentLength)
	assert.Equal(t, host, req.Host)
	assert.Same(t, ctx, req.Context())
	assert.NotNil(t, req.GetBody)
	assert.Equal(t, getb != nil, req.GetBody != nil)
	assert.Nil(t, req.Response)
	assert.NotSame(t, req, resp.Request, "the response's request is the attempt's clone")
	for _, h := range s.heads {
		assert.Equal(t, []string{"1", "2"}, h["X-Multi"])
	}
}

func TestDiscardedBodiesClosed(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	big := strings.Repeat("x", 1<<20)
	s := newScript(step{status: 503, body: big}, step{status: 502, body: big}, step{status: 429, body: "short"})
	defer s.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	c := &counting{next: base}
	clk := newFakeClock()
	tr := transport.New(c, transport.WithTestClock(clk.Now, clk.Sleep), transport.WithRetry(transport.Retry{MaxAttempts: 4}))
	req, _ := http.NewRequest("GET", s.URL, nil)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.EqualValues(t, 4, c.opened.Load())
	assert.EqualValues(t, 3, c.closed.Load(), "every discarded body is closed")
	assert.LessOrEqual(t, c.read.Load(), int64(3*(4096+1)), "at most 4 KiB drained from each")
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "ok", string(b))
	require.NoError(t, resp.Body.Close())
	assert.EqualValues(t, 4, c.closed.Load())
}

func TestConnectionErrors(t *testing.T) {
	// A server that drops the connection of its first n requests.
	dropper := func(n int32) *script {
		s := newScript()
		var dropped atomic.Int32
		s.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if dropped.Add(1) <= n {
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					conn.Close()
				}
				return
			}
			s.serve(w, r)
		})
		return s
	}
	tests := []struct {
		name    string
		method  string
		hdr     map[string]string
		retry   transport.Retry
		success bool
	}{
		{"GET retried", "GET", nil, transport.Retry{}, true},
		{"POST not retried", "POST", nil, transport.Retry{}, false},
		{"POST with Idempotency-Key retried", "POST", map[string]string{"Idempotency-Key": "abc"}, transport.Retry{}, true},
		{"POST opted in", "POST", nil, transport.Retry{NonIdempotent: true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := dropper(1)
			defer s.Close()
			// No keep-alive: net/http itself retries only on reused connections.
			base := &http.Transport{DisableKeepAlives: true}
			c := &counting{next: base}
			clk := newFakeClock()
			tr := transport.New(c, transport.WithTestClock(clk.Now, clk.Sleep), transport.WithRetry(tt.retry))
			req, _ := http.NewRequest(tt.method, s.URL, strings.NewReader("x"))
			for k, v := range tt.hdr {
				req.Header.Set(k, v)
			}
			resp, err := tr.RoundTrip(req)
			if tt.success {
				require.NoError(t, err)
				resp.Body.Close()
				assert.Equal(t, 200, resp.StatusCode)
				assert.EqualValues(t, 2, c.sent.Load())
			} else {
				require.Error(t, err)
				assert.Nil(t, resp)
				assert.EqualValues(t, 1, c.sent.Load())
			}
		})
	}
	t.Run("connection refused, attempts exhausted", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		l.Close()
		c := &counting{next: &http.Transport{}}
		clk := newFakeClock()
		tr := transport.New(c, transport.WithTestClock(clk.Now, clk.Sleep))
		req, _ := http.NewRequest("GET", "http://"+addr, nil)
		resp, err := tr.RoundTrip(req)
		require.Error(t, err)
		assert.Nil(t, resp)
		assert.EqualValues(t, 3, c.sent.Load())
		assert.Len(t, clk.Sleeps(), 2)
	})
	t.Run("cancelled context not retried", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			calls++
			cancel()
			return nil, r.Context().Err()
		})
		tr := transport.New(base)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://example.invalid", nil)
		_, err := tr.RoundTrip(req)
		assert.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, 1, calls)
	})
}

func TestCancelDuringRetryDelay(t *testing.T) {
	s := newScript(status(503, "Retry-After", "30"))
	defer s.Close()
	tr := transport.New(nil)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", s.URL, nil)
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	resp, err := tr.RoundTrip(req)
	assert.Nil(t, resp)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Less(t, time.Since(start), 5*time.Second)
}

func TestRetryPolicyPanicsOnNonsense(t *testing.T) {
	for _, r := range []transport.Retry{
		{MaxAttempts: -1}, {InitialInterval: -1}, {MaxInterval: -1}, {MaxRetryAfter: -1}, {Multiplier: 0.5}, {Multiplier: -2},
	} {
		assert.Panics(t, func() { transport.WithRetry(r) }, "%+v", r)
	}
}
