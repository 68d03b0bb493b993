package transport_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"
)

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// fakeClock is a clock whose sleeps return at once, advancing it, and are
// recorded.
type fakeClock struct {
	mu     sync.Mutex
	t      time.Time
	sleeps []time.Duration
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.t = c.t.Add(d)
	return ctx.Err()
}

func (c *fakeClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// step is one scripted response.
type step struct {
	status int
	header map[string]string
	body   string
}

// script is an httptest server that answers with its steps in order, then
// 200 "ok", and records what it received.
type script struct {
	*httptest.Server
	mu     sync.Mutex
	steps  []step
	hits   atomic.Int32
	bodies []string
	heads  []http.Header
}

func newScript(steps ...step) *script {
	s := &script{steps: steps}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

func (s *script) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	n := int(s.hits.Add(1))
	s.bodies = append(s.bodies, string(b))
	s.heads = append(s.heads, r.Header.Clone())
	st := step{status: 200, body: "ok"}
	if n <= len(s.steps) {
		st = s.steps[n-1]
	}
	s.mu.Unlock()
	for k, v := range st.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(st.status)
	io.WriteString(w, st.body)
}

func (s *script) Bodies() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bodies...)
}

// counting wraps a RoundTripper and counts response bodies opened, closed
// and the bytes read from them.
type counting struct {
	next   http.RoundTripper
	opened atomic.Int32
	closed atomic.Int32
	read   atomic.Int64
	sent   atomic.Int32
}

func (c *counting) RoundTrip(r *http.Request) (*http.Response, error) {
	c.sent.Add(1)
	resp, err := c.next.RoundTrip(r)
	if resp != nil && resp.Body != nil {
		c.opened.Add(1)
		resp.Body = &countingBody{ReadCloser: resp.Body, c: c}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	c    *counting
	once sync.Once
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.c.read.Add(int64(n))
	return n, err
}

func (b *countingBody) Close() error {
	b.once.Do(func() { b.c.closed.Add(1) })
	return b.ReadCloser.Close()
}

// closeTracker is a request body that records being closed.
type closeTracker struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeTracker) Close() error { c.closed.Store(true); return nil }

func status(code int, hdr ...string) step {
	s := step{status: code, body: fmt.Sprintf(`{"error":{"message":"status %d"}}`, code)}
	if len(hdr) > 0 {
		s.header = map[string]string{}
		for i := 0; i+1 < len(hdr); i += 2 {
			s.header[hdr[i]] = hdr[i+1]
		}
	}
	return s
}
