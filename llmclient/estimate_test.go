package llmclient_test

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
)

func TestEstimate(t *testing.T) {
	msgs := func(contents ...string) []llmclient.Message {
		var m []llmclient.Message
		for _, c := range contents {
			m = append(m, llmclient.Message{Role: "user", Content: c})
		}
		return m
	}
	for _, tc := range []struct {
		name string
		req  llmclient.ChatRequest
		want int
	}{
		{"no messages, default completion", llmclient.ChatRequest{}, 1024},
		{"rounded up", llmclient.ChatRequest{Messages: msgs("Say hello"), MaxTokens: 100}, 3 + 4 + 100},
		{"characters over all messages", llmclient.ChatRequest{Messages: msgs("ab", "cd", "e"), MaxTokens: 1}, 2 + 12 + 1},
		{"characters, not bytes", llmclient.ChatRequest{Messages: msgs("héllo wörld €"), MaxTokens: 1}, 4 + 4 + 1},
		{"max_completion_tokens wins", llmclient.ChatRequest{Messages: msgs("abcd"), MaxTokens: 100, MaxCompletionTokens: 10}, 1 + 4 + 10},
		{"default completion", llmclient.ChatRequest{Messages: msgs("abcd")}, 1 + 4 + 1024},
		{"a max_tokens that would overflow saturates", llmclient.ChatRequest{Messages: msgs("abcd"), MaxTokens: math.MaxInt}, math.MaxInt},
	} {
		assert.Equal(t, tc.want, llmclient.Estimate(tc.req), tc.name)
	}
}

// request returns a POST of body whose Body fails if read: RequestCost must
// read GetBody's copy only.
func request(t *testing.T, body string) *http.Request {
	t.Helper()
	r, err := http.NewRequest("POST", "https://api.example.com/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	r.Body = io.NopCloser(iotestErrReader{})
	return r
}

type iotestErrReader struct{}

func (iotestErrReader) Read([]byte) (int, error) { panic("the caller's body was read") }

func TestRequestCost(t *testing.T) {
	cost := llmclient.RequestCost(nil)
	for _, tc := range []struct {
		name, body string
		want       bucket.Cost
	}{
		{"string content", `{"model":"m","messages":[{"role":"user","content":"Say hello"}],"max_tokens":100}`,
			bucket.Cost{bucket.Requests: 1, bucket.Tokens: 107}},
		{"content parts", `{"messages":[{"role":"user","content":[{"type":"text","text":"Say "},` +
			`{"type":"image_url","image_url":{"url":"https://example.com/a.png"}},{"type":"text","text":"hello"}]}],` +
			`"max_completion_tokens":100,"stream":true,"stream_options":{"include_usage":true},"tools":[]}`,
			bucket.Cost{bucket.Requests: 1, bucket.Tokens: 107}},
		{"null content", `{"messages":[{"role":"assistant","content":null}],"max_tokens":1}`,
			bucket.Cost{bucket.Requests: 1, bucket.Tokens: 5}},
		{"no messages", `{"input":"embed me"}`, bucket.Cost{bucket.Requests: 1}},
		{"not JSON", `Say hello`, bucket.Cost{bucket.Requests: 1}},
	} {
		assert.Equal(t, tc.want, cost(request(t, tc.body)), tc.name)
	}

	t.Run("no GetBody", func(t *testing.T) {
		r := request(t, `{"messages":[{"role":"user","content":"x"}]}`)
		r.GetBody = nil
		assert.Equal(t, bucket.Cost{bucket.Requests: 1}, cost(r))
	})
	t.Run("no body", func(t *testing.T) {
		r, err := http.NewRequest("GET", "https://api.example.com/v1/models", nil)
		require.NoError(t, err)
		assert.Equal(t, bucket.Cost{bucket.Requests: 1}, cost(r))
	})
	t.Run("the body is left whole", func(t *testing.T) {
		body := `{"messages":[{"role":"user","content":"x"}]}`
		r, err := http.NewRequest("POST", "https://api.example.com/", bytes.NewReader([]byte(body)))
		require.NoError(t, err)
		cost(r)
		got, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		assert.Equal(t, body, string(got))
	})
	t.Run("estimator", func(t *testing.T) {
		var got llmclient.ChatRequest
		cost := llmclient.RequestCost(func(r llmclient.ChatRequest) int { got = r; return -5 })
		c := cost(request(t, `{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"Be brief."}]},`+
			`{"role":"user","content":"Hi"}],"max_tokens":7,"temperature":0.5}`))
		assert.Equal(t, bucket.Cost{bucket.Requests: 1, bucket.Tokens: 0}, c, "a negative estimate charges 0")
		temp := 0.5
		assert.Equal(t, llmclient.ChatRequest{Model: "m", Messages: []llmclient.Message{
			{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"},
		}, MaxTokens: 7, Temperature: &temp}, got)
	})
}
