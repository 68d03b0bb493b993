package transport_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
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

// worker is this test binary started again as a fleet worker process: it
// reads its configuration from an environment variable, says "ready" on
// stdout, waits for the start time on stdin, and reports on stdout.
type worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	stderr strings.Builder
}

// startWorker starts a worker with cfg, as JSON, in env; ctx kills it.
func startWorker(ctx context.Context, env string, cfg any) (*worker, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	w := &worker{cmd: exec.CommandContext(ctx, os.Args[0], "-test.run=^$")}
	w.cmd.Env = append(os.Environ(), env+"="+string(b))
	w.cmd.Stderr = &w.stderr
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	w.stdout = bufio.NewReader(out)
	return w, w.cmd.Start()
}

// awaitReady waits for every worker's "ready".
func awaitReady(workers []*worker) error {
	for i, w := range workers {
		if line, err := w.stdout.ReadString('\n'); err != nil || line != "ready\n" {
			return fmt.Errorf("worker %d not ready: %q %v: %s", i+1, line, err, w.stderr.String())
		}
	}
	return nil
}

// release tells every worker the start time, and closes its stdin.
func release(workers []*worker, start time.Time) error {
	for _, w := range workers {
		if _, err := fmt.Fprintln(w.stdin, start.UnixNano()); err != nil {
			return err
		}
		w.stdin.Close()
	}
	return nil
}

// report waits for worker i (counted from 0) to end and decodes what it
// reported, as JSON, into r.
func (w *worker) report(i int, r any) error {
	out, err := io.ReadAll(w.stdout)
	if err != nil {
		return err
	}
	if err := w.cmd.Wait(); err != nil {
		return fmt.Errorf("worker %d: %w: %s", i+1, err, w.stderr.String())
	}
	if err := json.Unmarshal(out, r); err != nil {
		return fmt.Errorf("worker %d output %q: %w", i+1, out, err)
	}
	return nil
}
