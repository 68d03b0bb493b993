package transport_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
)

const flightKeyName = "k"

func flightKeyFunc(*http.Request) string { return flightKeyName }

// TestInFlightSlotReleased: an attempt holds its slot from before it is sent
// until its body has been read to the end, or fails, or is closed, or its
// request's context ends, or the body is dropped unclosed and collected;
// an attempt that fails, or whose response has no body, gives it back at
// once.
func TestInFlightSlotReleased(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/cut": // a stream that breaks off
			w.Header().Set("Content-Length", "100")
			io.WriteString(w, "partial")
			w.(http.Flusher).Flush()
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		default:
			io.WriteString(w, "data: one\n\ndata: two\n\n")
		}
	}))
	defer srv.Close()
	refused := roundTripperFunc(func(*http.Request) (*http.Response, error) { return nil, errors.New("refused") })
	for _, tc := range []struct {
		name   string
		base   http.RoundTripper
		method string
		path   string
		held   bool // after RoundTrip
		end    func(t *testing.T, resp *http.Response, cancel context.CancelFunc)
	}{
		{name: "read to the end", held: true, end: func(t *testing.T, resp *http.Response, _ context.CancelFunc) {
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, "data: one\n\ndata: two\n\n", string(b))
		}},
		{name: "closed unread", held: true, end: func(t *testing.T, resp *http.Response, _ context.CancelFunc) {
			require.NoError(t, resp.Body.Close())
		}},
		{name: "read fails", path: "/cut", held: true, end: func(t *testing.T, resp *http.Response, _ context.CancelFunc) {
			_, err := io.ReadAll(resp.Body)
			require.Error(t, err)
		}},
		{name: "context ends", held: true, end: func(_ *testing.T, _ *http.Response, cancel context.CancelFunc) { cancel() }},
		{name: "dropped unclosed", held: true, end: func(*testing.T, *http.Response, context.CancelFunc) {}},
		{name: "no body", method: http.MethodHead},
		{name: "transport error", base: refused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sem := bucket.NewLocalInFlight(1)
			base := tc.base
			if base == nil {
				base = http.DefaultTransport
			}
			tr := transport.New(base, transport.WithInFlight(sem), transport.WithKey(flightKeyFunc),
				transport.WithRetry(transport.Retry{MaxAttempts: 1}))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			req, err := http.NewRequestWithContext(ctx, method, srv.URL+tc.path, nil)
			require.NoError(t, err)
			resp, err := tr.RoundTrip(req)
			if tc.base != nil {
				require.Error(t, err)
				assert.Zero(t, sem.Held(flightKeyName))
				return
			}
			require.NoError(t, err)
			if !tc.held {
				assert.Zero(t, sem.Held(flightKeyName), "given back at once")
				resp.Body.Close()
				return
			}
			assert.Equal(t, 1, sem.Held(flightKeyName), "held while the body streams")
			tc.end(t, resp, cancel)
			dropped := tc.name == "dropped unclosed"
			if dropped {
				resp = nil
			}
			assert.Eventually(t, func() bool {
				if dropped {
					runtime.GC()
				}
				return sem.Held(flightKeyName) == 0
			}, 5*time.Second, time.Millisecond, "given back")
			runtime.KeepAlive(resp) // the others' are not collected: the body gave it back

		})
	}
}

// TestInFlightSlotBeforeBucket: a call waiting for a slot has taken no
// token from the bucket; once the slot is free it takes one and goes.
func TestInFlightSlotBeforeBucket(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	sem := bucket.NewLocalInFlight(1)
	b := bucket.NewLocal(bucket.Limit{Rate: 0.001, Burst: 5})
	tr := transport.New(nil, transport.WithInFlight(sem), transport.WithBucket(b), transport.WithKey(flightKeyFunc))
	client := &http.Client{Transport: tr}
	first, err := client.Get(srv.URL)
	require.NoError(t, err)
	tokens := b.Tokens(flightKeyName)[bucket.Requests]
	assert.InDelta(t, 4, tokens, 0.01, "the first call took a token")
	done := make(chan error, 1)
	go func() {
		resp, err := client.Get(srv.URL)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // long enough to take a token, were it first
	assert.InDelta(t, tokens, b.Tokens(flightKeyName)[bucket.Requests], 0.001, "the waiter took no token")
	assert.Equal(t, int64(1), hits.Load())
	require.NoError(t, first.Body.Close())
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter never got the slot")
	}
	assert.InDelta(t, tokens-1, b.Tokens(flightKeyName)[bucket.Requests], 0.001)
	assert.Equal(t, int64(2), hits.Load())
}

// TestInFlightMaxWait: a call that gets no slot within WithMaxWait fails
// with ErrDeadline, having taken nothing; and the request's deadline bounds
// the wait too.
func TestInFlightMaxWait(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	sem := bucket.NewLocalInFlight(1)
	b := bucket.NewLocal(bucket.Limit{Rate: 0.001, Burst: 5})
	tr := transport.New(nil, transport.WithInFlight(sem), transport.WithBucket(b), transport.WithKey(flightKeyFunc),
		transport.WithMaxWait(50*time.Millisecond))
	client := &http.Client{Transport: tr}
	held, err := client.Get(srv.URL)
	require.NoError(t, err)
	defer held.Body.Close()
	tokens := b.Tokens(flightKeyName)[bucket.Requests]
	start := time.Now()
	_, err = client.Get(srv.URL)
	assert.ErrorIs(t, err, bucket.ErrDeadline)
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	assert.InDelta(t, tokens, b.Tokens(flightKeyName)[bucket.Requests], 0.001, "no token taken")
	assert.Equal(t, 1, sem.Held(flightKeyName))

	tr = transport.New(nil, transport.WithInFlight(sem), transport.WithKey(flightKeyFunc))
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	_, err = tr.RoundTrip(req)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, 1, sem.Held(flightKeyName))
}

// TestInFlightRetryFreesSlot: the slot of an attempt that is retried is
// given back before the retry waits out its Retry-After, and taken again
// for the retry.
func TestInFlightRetryFreesSlot(t *testing.T) {
	var hits atomic.Int64
	refused := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			w.Header().Set("Retry-After-Ms", "500")
			w.WriteHeader(http.StatusTooManyRequests)
			close(refused)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	sem := bucket.NewLocalInFlight(1)
	tr := transport.New(nil, transport.WithInFlight(sem), transport.WithKey(flightKeyFunc))
	done := make(chan error, 1)
	go func() {
		resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-refused
	assert.Eventually(t, func() bool { return sem.Held(flightKeyName) == 0 }, 400*time.Millisecond, time.Millisecond,
		"free while the retry waits")
	require.NoError(t, <-done)
	assert.Equal(t, int64(2), hits.Load())
	assert.Zero(t, sem.Held(flightKeyName))
}
