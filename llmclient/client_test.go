package llmclient_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/transport"
)

func TestChat(t *testing.T) {
	s := newLLM(t)
	b := newBucket()
	c := llmclient.New(s.URL, "sk-test", llmclient.WithBucket(b), withKey())

	resp, err := c.Chat(t.Context(), hello)
	require.NoError(t, err)
	require.Len(t, resp.Choices, 1)
	assert.Equal(t, "assistant", resp.Choices[0].Message.Role)
	assert.NotEmpty(t, resp.Choices[0].Message.Content)
	assert.Equal(t, "stop", resp.Choices[0].FinishReason)
	assert.Equal(t, llmclient.Usage{PromptTokens: 6, CompletionTokens: 10, TotalTokens: helloUsage}, resp.Usage)

	assert.Equal(t, bucket.Cost{bucket.Requests: 1, bucket.Tokens: helloCharged}, spent(b),
		"charged the estimate, reconciled to the prompt and the cap, as OpenAI counts")
	st := s.Stats()
	assert.EqualValues(t, 1, st.Accepted)
	assert.EqualValues(t, helloUsage, st.TotalTokens)
}

func TestChatStream(t *testing.T) {
	s := newLLM(t)
	b := newBucket()
	c := llmclient.New(s.URL, "sk-test", llmclient.WithBucket(b), withKey())

	var text strings.Builder
	var usage *llmclient.Usage
	chunks := 0
	for chunk, err := range c.ChatStream(t.Context(), hello) {
		require.NoError(t, err)
		chunks++
		for _, ch := range chunk.Choices {
			text.WriteString(ch.Delta.Content)
		}
		if chunk.Usage != nil {
			usage = chunk.Usage
		}
	}
	assert.NotEmpty(t, text.String())
	assert.Greater(t, chunks, 10, "one chunk per token, then the usage")
	require.NotNil(t, usage, "the client asks for the usage")
	assert.Equal(t, helloUsage, usage.TotalTokens)
	assert.Equal(t, bucket.Cost{bucket.Requests: 1, bucket.Tokens: helloCharged}, spent(b))

	// The same text as the plain completion.
	resp, err := c.Chat(t.Context(), hello)
	require.NoError(t, err)
	assert.Equal(t, resp.Choices[0].Message.Content, text.String())
}

func TestChatStreamLeftEarlyKeepsTheCharge(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	// The server sends one chunk and holds the rest, usage included, until
	// the client has gone.
	srv := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"total_tokens\":16}}\n\ndata: [DONE]\n\n")
	})
	b := newBucket()
	c := llmclient.New(srv.URL, "sk-test", llmclient.WithBucket(b), withKey())
	for chunk, err := range c.ChatStream(t.Context(), hello) {
		require.NoError(t, err)
		assert.Equal(t, "Hi", chunk.Choices[0].Delta.Content)
		break
	}
	assert.Equal(t, bucket.Cost{bucket.Requests: 1, bucket.Tokens: helloEstimate}, spent(b),
		"the usage never showed: the estimate stands")
	srv.Close() // returns once the handler has seen the client go
}

func TestChatStreamCutOff(t *testing.T) {
	// A stream that ends before its usage and its [DONE].
	srv := newRecorder(t, reply(200, "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
		"Content-Type", "text/event-stream"))
	b := newBucket()
	c := llmclient.New(srv.URL, "sk-test", llmclient.WithBucket(b), withKey())
	var got []string
	var gotErr error
	for chunk, err := range c.ChatStream(t.Context(), hello) {
		if err != nil {
			gotErr = err
			break
		}
		got = append(got, chunk.Choices[0].Delta.Content)
	}
	assert.Equal(t, []string{"Hi"}, got)
	assert.ErrorIs(t, gotErr, io.ErrUnexpectedEOF)
	assert.Equal(t, bucket.Cost{bucket.Requests: 1, bucket.Tokens: helloEstimate}, spent(b))
}

func TestChatStreamRequest(t *testing.T) {
	srv := newRecorder(t, reply(200, "data: [DONE]\n\n", "Content-Type", "text/event-stream"))
	c := llmclient.New(srv.URL+"/v1/", "sk-test", llmclient.WithBucket(newBucket()))
	for _, err := range c.ChatStream(t.Context(), hello) {
		require.NoError(t, err)
	}
	heads, bodies := srv.requests()
	require.Len(t, bodies, 1)
	assert.JSONEq(t, `{"model":"gpt-test","messages":[{"role":"user","content":"Say hello"}],"max_tokens":100,
		"stream":true,"stream_options":{"include_usage":true}}`, bodies[0])
	assert.Equal(t, "Bearer sk-test", heads[0].Get("Authorization"))
	assert.Equal(t, "application/json", heads[0].Get("Content-Type"))
}

func TestReconcileDebits(t *testing.T) {
	s := newLLM(t)
	b := newBucket()
	var seen []llmclient.ChatRequest
	c := llmclient.New(s.URL, "sk-test", llmclient.WithBucket(b), withKey(),
		llmclient.WithEstimator(func(r llmclient.ChatRequest) int {
			seen = append(seen, r)
			return 3
		}))
	_, err := c.Chat(t.Context(), hello)
	require.NoError(t, err)
	assert.Equal(t, []llmclient.ChatRequest{hello}, seen, "the estimator sees the request")
	assert.Equal(t, bucket.Cost{bucket.Requests: 1, bucket.Tokens: helloCharged}, spent(b),
		"charged 3, debited up to the usage")

	for _, err := range c.ChatStream(t.Context(), hello) {
		require.NoError(t, err)
	}
	assert.Equal(t, bucket.Cost{bucket.Requests: 2, bucket.Tokens: 2 * helloCharged}, spent(b))
}

func TestDefaultKeyHashesTheAPIKey(t *testing.T) {
	s := newLLM(t)
	b := newBucket()
	c := llmclient.New(s.URL, "sk-secret-key", llmclient.WithBucket(b))
	_, err := c.Chat(t.Context(), hello)
	require.NoError(t, err)
	host := strings.TrimSuffix(s.URL, "/v1")
	k := host + "#" + transport.Fingerprint("sk-secret-key") + "/" + hello.Model
	assert.Equal(t, float64(testTPM-helloCharged), b.Tokens(k)[bucket.Tokens], "ModelKey: the credential's hash and the model")
}

func TestDefaultBucket(t *testing.T) {
	// The client's own bucket has the limits given: a call whose estimate
	// exceeds the TPM fails at once, without reaching the server.
	s := newLLM(t)
	c := llmclient.New(s.URL, "sk-test", llmclient.WithLimits(60, 200))
	_, err := c.Chat(t.Context(), hello)
	require.NoError(t, err, "107 tokens of 200")
	big := hello
	big.MaxTokens = 1000
	_, err = c.Chat(t.Context(), big)
	assert.ErrorIs(t, err, bucket.ErrExceedsBurst)
	assert.ErrorContains(t, err, "the call's estimate, 1007 tokens, is 7 for the prompt")
	assert.ErrorContains(t, err, "1000 for the completion (MaxTokens): set MaxTokens lower, or the tokens limit's burst higher")
	unset := hello
	unset.MaxTokens = 0
	for _, err = range c.ChatStream(t.Context(), unset) {
	}
	assert.ErrorContains(t, err, "1024 for the completion (MaxTokens unset, so 1,024 were assumed)")
	assert.ErrorContains(t, err, `cost 1031 of "tokens" exceeds burst 200`)
	assert.EqualValues(t, 1, s.Stats().Accepted)
}

func TestAPIError(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		header []string
		want   llmclient.APIError
		text   string
		// throttled responses make the bucket slow down (Observe)
		throttled bool
	}{
		{
			name:   "OpenAI",
			status: 400,
			body:   `{"error":{"message":"Invalid model","type":"invalid_request_error","param":"model","code":"model_not_found"}}`,
			want:   llmclient.APIError{StatusCode: 400, Type: "invalid_request_error", Code: "model_not_found", Message: "Invalid model"},
			text:   "llmclient: 400 Bad Request: invalid_request_error: model_not_found: Invalid model",
		},
		{
			name:   "rate limited, retries spent",
			status: 429,
			body:   `{"error":{"message":"Rate limit reached","type":"tokens","code":"rate_limit_exceeded"}}`,
			header: []string{"Retry-After", "2", "Retry-After-Ms", "1500"},
			want: llmclient.APIError{StatusCode: 429, Type: "tokens", Code: "rate_limit_exceeded",
				Message: "Rate limit reached", RetryAfter: 1500 * time.Millisecond},
			throttled: true,
		},
		{
			name:      "Retry-After in seconds",
			status:    503,
			body:      `{"error":{"message":"busy","code":503}}`,
			header:    []string{"Retry-After", "3"},
			want:      llmclient.APIError{StatusCode: 503, Code: "503", Message: "busy", RetryAfter: 3 * time.Second},
			throttled: true,
		},
		{
			name:      "Anthropic",
			status:    529,
			body:      `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
			want:      llmclient.APIError{StatusCode: 529, Type: "overloaded_error", Message: "Overloaded"},
			text:      "llmclient: 529: overloaded_error: Overloaded",
			throttled: true,
		},
		{
			name:   "not JSON",
			status: 502,
			body:   "  <html>Bad gateway</html>\n",
			want:   llmclient.APIError{StatusCode: 502, Message: "<html>Bad gateway</html>"},
			text:   "llmclient: 502 Bad Gateway: <html>Bad gateway</html>",
		},
		{
			name:   "long, not JSON",
			status: 500,
			body:   strings.Repeat("é", 300),
			want:   llmclient.APIError{StatusCode: 500, Message: strings.Repeat("é", 128) + "…"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newRecorder(t, reply(tc.status, tc.body, tc.header...))
			check := func(b *bucket.Local, err error) {
				t.Helper()
				var apiErr *llmclient.APIError
				require.ErrorAs(t, err, &apiErr)
				assert.Equal(t, tc.want, *apiErr)
				if tc.text != "" {
					assert.EqualError(t, err, tc.text)
				}
				if !tc.throttled { // else the bucket has slowed down
					assert.Equal(t, bucket.Cost{bucket.Requests: 1, bucket.Tokens: helloEstimate}, spent(b),
						"an error reports no usage: the charge stands")
				}
			}
			b := newBucket()
			_, err := llmclient.New(srv.URL, "sk-test", llmclient.WithBucket(b), withKey(), noRetry).Chat(t.Context(), hello)
			check(b, err)
			b = newBucket()
			for _, err := range llmclient.New(srv.URL, "sk-test", llmclient.WithBucket(b), withKey(), noRetry).ChatStream(t.Context(), hello) {
				check(b, err)
			}
		})
	}
}

func TestAPIErrorInStream(t *testing.T) {
	srv := newRecorder(t, reply(200, "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"+
		"data: {\"error\":{\"message\":\"The server had an error\",\"type\":\"server_error\"}}\n\n",
		"Content-Type", "text/event-stream"))
	c := llmclient.New(srv.URL, "sk-test", llmclient.WithBucket(newBucket()))
	var errs []error
	for _, err := range c.ChatStream(t.Context(), hello) {
		errs = append(errs, err)
	}
	require.Len(t, errs, 2)
	assert.NoError(t, errs[0])
	var apiErr *llmclient.APIError
	require.ErrorAs(t, errs[1], &apiErr)
	assert.Equal(t, llmclient.APIError{StatusCode: 200, Type: "server_error", Message: "The server had an error"}, *apiErr)
}

func TestAPIKeyNeverInErrorsOrLogs(t *testing.T) {
	const apiKey = "sk-very-secret-0123456789"
	// A server that echoes the credential in its error messages.
	srv := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"message":"Too many requests for `+r.Header.Get("Authorization")+`","type":"`+
			apiKey+`","code":"`+apiKey+`"}}`)
	})
	var logs strings.Builder
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c := llmclient.New(srv.URL, apiKey, llmclient.WithBucket(newBucket()),
		llmclient.WithTransportOptions(transport.WithLogger(logger),
			transport.WithRetry(transport.Retry{MaxAttempts: 2, InitialInterval: time.Millisecond})))

	_, err := c.Chat(t.Context(), hello)
	require.Error(t, err)
	assert.Equal(t, "llmclient: 429 Too Many Requests: [redacted]: [redacted]: Too many requests for Bearer [redacted]", err.Error())
	var apiErr *llmclient.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.NotContains(t, apiErr.Message+apiErr.Type+apiErr.Code, apiKey)
	for _, err := range c.ChatStream(t.Context(), hello) {
		assert.NotContains(t, err.Error(), apiKey)
	}

	// A transport error, and a bucket error.
	unreachable := llmclient.New("http://127.0.0.1:1/v1", apiKey, noRetry)
	_, err = unreachable.Chat(t.Context(), hello)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), apiKey)
	tooBig := llmclient.New(srv.URL, apiKey, llmclient.WithLimits(1, 1))
	_, err = tooBig.Chat(t.Context(), hello)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), apiKey)

	assert.Contains(t, logs.String(), "sluice: retrying", "the logs were written")
	assert.NotContains(t, logs.String(), apiKey)
	assert.NotContains(t, logs.String(), "very-secret")
}

func TestChatErrors(t *testing.T) {
	t.Run("not JSON", func(t *testing.T) {
		srv := newRecorder(t, reply(200, "<html>", "Content-Type", "text/html"))
		_, err := llmclient.New(srv.URL, "", llmclient.WithBucket(newBucket())).Chat(t.Context(), hello)
		assert.ErrorContains(t, err, "llmclient: decoding the response: ")
		heads, _ := srv.requests()
		assert.Empty(t, heads[0].Get("Authorization"), "no API key, no Authorization")
	})
	t.Run("context canceled", func(t *testing.T) {
		srv := newRecorder(t, reply(200, "{}"))
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		c := llmclient.New(srv.URL, "sk-test", llmclient.WithBucket(newBucket()))
		_, err := c.Chat(ctx, hello)
		assert.ErrorIs(t, err, context.Canceled)
		for _, err := range c.ChatStream(ctx, hello) {
			assert.ErrorIs(t, err, context.Canceled)
		}
	})
	t.Run("bad base URL", func(t *testing.T) {
		_, err := llmclient.New("://nope", "sk-test").Chat(t.Context(), hello)
		assert.ErrorContains(t, err, "llmclient: ")
		assert.False(t, errors.Is(err, context.Canceled))
	})
}
