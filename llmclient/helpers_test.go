package llmclient_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/llmfixture"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/transport"
)

// The fixtures these tests share with compat's (internal/llmfixture).
var (
	newBucket    = llmfixture.Bucket
	spent        = llmfixture.Spent
	newLLM       = llmfixture.Server
	newTransport = llmfixture.Transport
)

const (
	testRPM       = llmfixture.RPM
	testTPM       = llmfixture.TPM
	key           = llmfixture.Key
	helloEstimate = llmfixture.HelloEstimate
	helloUsage    = llmfixture.HelloUsage
	helloCharged  = llmfixture.HelloCharged
)

func withKey() llmclient.Option {
	return llmclient.WithKey(func(*http.Request) string { return key })
}

// hello is a request of 9 characters capped at 100 tokens: Estimate makes
// it ⌈9/4⌉ + 4 + 100 = 107 tokens; llmtest answers ⌈9/4⌉ + 3 + 10 = 16.
var hello = llmclient.ChatRequest{
	Model:     "gpt-test",
	Messages:  []llmclient.Message{{Role: "user", Content: "Say hello"}},
	MaxTokens: 100,
}

// recorder is an httptest server that answers every request with its
// handler and records the requests' headers and bodies.
type recorder struct {
	*httptest.Server
	mu     sync.Mutex
	heads  []http.Header
	bodies []string
}

func newRecorder(t *testing.T, h http.HandlerFunc) *recorder {
	t.Helper()
	r := &recorder{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.heads = append(r.heads, req.Header.Clone())
		r.bodies = append(r.bodies, string(b))
		r.mu.Unlock()
		h(w, req)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *recorder) requests() ([]http.Header, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]http.Header(nil), r.heads...), append([]string(nil), r.bodies...)
}

// reply answers with status, header pairs and body.
func reply(status int, body string, header ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// noRetry makes one attempt per call, and holds the key back for at most
// 1ms after a Retry-After.
var noRetry = llmclient.WithTransportOptions(
	transport.WithRetry(transport.Retry{MaxAttempts: 1, MaxRetryAfter: time.Millisecond}))
