package transport_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openaiServer is a fake OpenAI API that answers its first throttle
// requests with 429 and the rest with an llmtest.Handler, recording
// requests.
type openaiServer struct {
	*httptest.Server
	mu       sync.Mutex
	throttle int
	bodies   []string
	auth     []string
}

func newOpenAIServer(throttle int) *openaiServer {
	s := &openaiServer{throttle: throttle}
	chat := llmtest.NewHandler(llmtest.Config{ReplyTokens: replyTokens})
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.bodies = append(s.bodies, string(b))
		s.auth = append(s.auth, r.Header.Get("Authorization"))
		throttled := len(s.bodies) <= s.throttle
		s.mu.Unlock()
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		if throttled {
			w.Header().Set("Retry-After-Ms", "20")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`)
			return
		}
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		chat.ServeHTTP(w, r)
	}))
	return s
}

func (s *openaiServer) requests() ([]string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bodies...), append([]string(nil), s.auth...)
}

// newOpenAI returns the official client sending through sluice, with its
// own retries off.
func newOpenAI(s *openaiServer) openai.Client {
	httpClient := transport.NewClient(
		transport.WithBucket(bucket.NewLocal(bucket.PerSecond(50))),
		transport.WithKey(transport.CredentialKey),
	)
	return openai.NewClient(
		option.WithBaseURL(s.URL+"/v1/"),
		option.WithAPIKey("sk-test-key"),
		option.WithHTTPClient(httpClient),
		option.WithMaxRetries(0),
	)
}

var chatParams = openai.ChatCompletionNewParams{
	Model:    "gpt-5-mini",
	Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
}

// replyTokens is the length of the fake API's replies: reply, in tokens
// of 4 characters.
const (
	replyTokens = 5
	reply       = "Lorem ipsum dolor si"
)

func TestOpenAIClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("429 retried", func(t *testing.T) {
		s := newOpenAIServer(1)
		defer s.Close()
		client := newOpenAI(s)
		res, err := client.Chat.Completions.New(ctx, chatParams)
		require.NoError(t, err)
		require.Len(t, res.Choices, 1)
		assert.Equal(t, reply, res.Choices[0].Message.Content)
		bodies, auth := s.requests()
		require.Len(t, bodies, 2, "the 429 and its retry")
		assert.Equal(t, bodies[0], bodies[1], "the body is replayed")
		assert.Contains(t, bodies[0], `"Say hello"`)
		assert.Equal(t, []string{"Bearer sk-test-key", "Bearer sk-test-key"}, auth)
	})
	t.Run("completion", func(t *testing.T) {
		s := newOpenAIServer(0)
		defer s.Close()
		client := newOpenAI(s)
		res, err := client.Chat.Completions.New(ctx, chatParams)
		require.NoError(t, err)
		assert.Equal(t, reply, res.Choices[0].Message.Content)
		prompt := llmtest.PromptTokens(llmtest.ChatRequest{Messages: []llmtest.Message{{Role: "user", Content: "Say hello"}}})
		assert.EqualValues(t, prompt+replyTokens, res.Usage.TotalTokens)
		bodies, _ := s.requests()
		assert.Len(t, bodies, 1)
	})
	t.Run("streamed completion", func(t *testing.T) {
		s := newOpenAIServer(1)
		defer s.Close()
		client := newOpenAI(s)
		stream := client.Chat.Completions.NewStreaming(ctx, chatParams)
		var got strings.Builder
		chunks := 0
		for stream.Next() {
			ch := stream.Current()
			chunks++
			if len(ch.Choices) > 0 {
				got.WriteString(ch.Choices[0].Delta.Content)
			}
		}
		require.NoError(t, stream.Err())
		require.NoError(t, stream.Close())
		assert.Equal(t, reply, got.String())
		assert.Equal(t, replyTokens+2, chunks, "the role, a chunk per token, the finish")
		bodies, _ := s.requests()
		require.Len(t, bodies, 2, "a 429, then the stream")
		assert.Contains(t, bodies[1], `"stream":true`)
	})
}
