package llmclient_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
)

// frozen is a bucket clock that never moves: nothing refills, so that a
// test reads exactly what was charged and reconciled.
type frozen struct{}

func (frozen) Now() time.Time { return time.Unix(1_800_000_000, 0) }

// Limits of the test buckets.
const (
	testRPM = 100
	testTPM = 10_000
)

// newBucket returns a frozen bucket of testRPM requests and testTPM
// tokens.
func newBucket() *bucket.Local {
	return bucket.NewLocal(bucket.PerMinute(testRPM),
		bucket.WithLimit(bucket.Tokens, bucket.PerMinute(testTPM)), bucket.WithClock(frozen{}))
}

// key is the bucket key of the tests that set one.
const key = "k"

func withKey() llmclient.Option {
	return llmclient.WithKey(func(*http.Request) string { return key })
}

// spent returns what key has spent of b, per dimension.
func spent(b *bucket.Local) bucket.Cost {
	tok := b.Tokens(key)
	return bucket.Cost{bucket.Requests: testRPM - tok[bucket.Requests], bucket.Tokens: testTPM - tok[bucket.Tokens]}
}

// newLLM starts an llmtest server with no limits and replies of 10 tokens.
func newLLM(t *testing.T) *llmtest.Server {
	t.Helper()
	s := llmtest.NewServer(llmtest.Config{ReplyTokens: 10})
	t.Cleanup(s.Close)
	return s
}

// hello is a request of 9 characters capped at 100 tokens: Estimate makes
// it ⌈9/4⌉ + 4 + 100 = 107 tokens; llmtest answers ⌈9/4⌉ + 3 + 10 = 16.
var hello = llmclient.ChatRequest{
	Model:     "gpt-test",
	Messages:  []llmclient.Message{{Role: "user", Content: "Say hello"}},
	MaxTokens: 100,
}

const (
	helloEstimate = 107
	helloUsage    = 16
)

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
