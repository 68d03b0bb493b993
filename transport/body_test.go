package transport_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/transport"
)

// quotaBody is a 429 body that says the quota is spent.
const quotaBody = `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`

// stallServer answers its first request with code (a 429, a 503) that
// writes its headers and the first part of quotaBody, then stalls until release is closed
// before it writes the rest; then 200 "ok". gone is closed when the client
// drops the stalled response.
type stallServer struct {
	*httptest.Server
	release, gone chan struct{}
	hits          atomic.Int32
}

// stallCut is where stallServer's body stalls.
const stallCut = 20

func newStallServer(t *testing.T, code int) *stallServer {
	s := &stallServer{release: make(chan struct{}), gone: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.hits.Add(1) > 1 {
			io.WriteString(w, "ok")
			return
		}
		w.Header().Set("Retry-After-Ms", "1")
		w.WriteHeader(code)
		io.WriteString(w, quotaBody[:stallCut])
		w.(http.Flusher).Flush()
		select {
		case <-s.release:
			io.WriteString(w, quotaBody[stallCut:])
		case <-r.Context().Done():
			close(s.gone)
		}
	}))
	t.Cleanup(func() {
		select {
		case <-s.release:
		default:
			close(s.release)
		}
		s.Close()
	})
	return s
}

// roundTripWithin returns what tr.RoundTrip(GET url) returns, failing t if
// that takes longer than within.
func roundTripWithin(t *testing.T, tr http.RoundTripper, url string, within time.Duration) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	require.NoError(t, err)
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		done <- result{resp, err}
	}()
	select {
	case r := <-done:
		require.NoError(t, r.err)
		t.Cleanup(func() { r.resp.Body.Close() })
		return r.resp
	case <-time.After(within):
		t.Fatalf("RoundTrip still held after %v by a stalled body", within)
		return nil
	}
}

// TestStalledQuotaBodyDoesNotHoldRoundTrip: the transport looks into a
// 429's body (is the quota spent?) before it returns the response; a body
// that stalled held RoundTrip until the context's deadline, forever without
// one. The look is bounded in time: a body not whole in time is taken for
// no spent quota, and the caller gets it whole, in order, as it comes.
func TestStalledQuotaBodyDoesNotHoldRoundTrip(t *testing.T) {
	clk := newFakeClock()
	t.Run("returned: read whole", func(t *testing.T) {
		s := newStallServer(t, http.StatusTooManyRequests)
		tr := transport.New(nil, transport.WithTestClock(clk.Now, clk.Sleep), transport.WithRetry(transport.Retry{MaxAttempts: 1}))
		resp := roundTripWithin(t, tr, s.URL, 10*time.Second)
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		close(s.release)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, quotaBody, string(got), "the bytes looked at, then those of the read in flight, then the rest")
	})
	t.Run("returned: Close ends a read", func(t *testing.T) {
		s := newStallServer(t, http.StatusTooManyRequests)
		tr := transport.New(nil, transport.WithTestClock(clk.Now, clk.Sleep), transport.WithRetry(transport.Retry{MaxAttempts: 1}))
		resp := roundTripWithin(t, tr, s.URL, 10*time.Second)
		read := make(chan string, 1)
		go func() {
			b, _ := io.ReadAll(resp.Body)
			read <- string(b)
		}()
		time.Sleep(50 * time.Millisecond) // let the read block
		require.NoError(t, resp.Body.Close())
		select {
		case b := <-read:
			assert.True(t, strings.HasPrefix(quotaBody, b), "what was read is the body's start: %q", b)
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not end the read")
		}
	})
	for _, code := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		t.Run(fmt.Sprintf("retried %d: no spent quota, drained within the bound, closed", code), func(t *testing.T) {
			s := newStallServer(t, code)
			tr := transport.New(nil, transport.WithTestClock(clk.Now, clk.Sleep))
			resp := roundTripWithin(t, tr, s.URL, 10*time.Second)
			assert.Equal(t, http.StatusOK, resp.StatusCode, "retried")
			assert.EqualValues(t, 2, s.hits.Load())
			select {
			case <-s.gone:
			case <-time.After(10 * time.Second):
				t.Fatal("the stalled body was not closed")
			}
		})
	}
}

// onceBody is a response body that counts the reads made after it has
// returned io.EOF.
type onceBody struct {
	io.Reader
	eof, after atomic.Int32
}

func (b *onceBody) Read(p []byte) (int, error) {
	if b.eof.Load() > 0 {
		b.after.Add(1)
	}
	n, err := b.Reader.Read(p)
	if err == io.EOF {
		b.eof.Add(1)
	}
	return n, err
}

func (b *onceBody) Close() error { return nil }

// TestQuotaBodyPeekedOnce: a 429's body was looked into twice, once to
// tell the bucket (observe) and again to decide the retry (retryDelay),
// each reading it to its end. It is read once, and the verdict is shared.
func TestQuotaBodyPeekedOnce(t *testing.T) {
	body := &onceBody{Reader: strings.NewReader(quotaBody)}
	var hits atomic.Int32
	base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		hits.Add(1)
		return &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{}, Body: body, Request: r}, nil
	})
	tr := transport.New(base)
	resp, err := get(t, tr, context.Background(), "http://example.invalid/")
	require.NoError(t, err)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.EqualValues(t, 1, hits.Load(), "a spent quota is not retried")
	assert.Zero(t, body.after.Load(), "the body is read to its end once before RoundTrip returns")
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, quotaBody, string(got))
}
