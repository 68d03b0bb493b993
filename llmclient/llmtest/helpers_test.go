package llmtest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// epoch is where test clocks start: a whole hour, so windows align.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// clock is a manual clock, safe for concurrent use.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: epoch} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// send sends a request to h and returns its answer.
func send(h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(body)))
	return w
}

// get sends a plain GET to h.
func get(h http.Handler) *httptest.ResponseRecorder {
	return send(h, http.MethodGet, "/v1/anything", "")
}

// post sends body to h's chat endpoint.
func post(h http.Handler, body string) *httptest.ResponseRecorder {
	return send(h, http.MethodPost, "/v1/chat/completions", body)
}

// chat sends req to h's chat endpoint.
func chat(t *testing.T, h http.Handler, req ChatRequest) *httptest.ResponseRecorder {
	t.Helper()
	b, err := json.Marshal(req)
	require.NoError(t, err)
	return post(h, string(b))
}

// userMessage returns a request of one user message of content.
func userMessage(content string, maxTokens int) ChatRequest {
	return ChatRequest{Model: "gpt-test", Messages: []Message{{Role: "user", Content: content}}, MaxTokens: maxTokens}
}

// apiError decodes an OpenAI error body.
func apiError(t *testing.T, w *httptest.ResponseRecorder) errorJSON {
	t.Helper()
	var e errorJSON
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &e), w.Body.String())
	return e
}
