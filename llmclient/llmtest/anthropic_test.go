package llmtest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// messages sends body to h's Messages endpoint.
func messages(h http.Handler, body string) *httptest.ResponseRecorder {
	return send(h, http.MethodPost, "/v1/messages", body)
}

// hello is a Messages request of one user message of content.
func hello(content string, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{"model": "claude-test", "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	return string(b)
}

// anthropicError decodes an Anthropic error body.
func anthropicError(t *testing.T, w *httptest.ResponseRecorder) anthropicErrorJSON {
	t.Helper()
	var e anthropicErrorJSON
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &e), w.Body.String())
	require.Equal(t, "error", e.Type)
	return e
}

func TestMessageInputTokens(t *testing.T) {
	for _, tc := range []struct {
		name, fields string
		want         int
	}{
		{"a string", `"messages":[{"role":"user","content":"Hello"}]`, 2 + 3},
		{"a system prompt", `"system":"Be brief.","messages":[{"role":"user","content":"Hello"}]`, 4 + 3},
		{"system blocks", `"system":[{"type":"text","text":"Be "},{"type":"text","text":"brief."}],"messages":[{"role":"user","content":"Hello"}]`, 4 + 3},
		{"blocks", `"messages":[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image","source":{"data":"xxxxxxxx"}},{"type":"text","text":"e"}]}]`, 2 + 3},
		{"tool use and result", `"messages":[` +
			`{"role":"assistant","content":[{"type":"thinking","thinking":"hmm"},{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"abcdefgh"}]}]}]`,
			// hmm + {"a":1} + abcdefgh: 18 code points
			5 + 6},
		{"tools as sent", `"tools":[{"name":"f","input_schema":{}}],"messages":[{"role":"user","content":"abcd"}]`,
			// 30 + 4 code points
			9 + 3},
		{"code points, not bytes", `"messages":[{"role":"user","content":"héllo wörld €"}]`, 4 + 3},
		{"null content", `"messages":[{"role":"assistant","content":null}]`, 3},
	} {
		var req MessagesRequest
		require.NoError(t, json.Unmarshal([]byte(`{`+tc.fields+`}`), &req), tc.name)
		assert.Equal(t, tc.want, MessageInputTokens(req), tc.name)
	}
	var c Content
	assert.Error(t, json.Unmarshal([]byte(`42`), &c))
	assert.Error(t, json.Unmarshal([]byte(`[42]`), &c))
}

// message is what the tests read of a Message.
type message struct {
	ID         string `json:"id"`
	Type       string `json:"type"`
	Role       string `json:"role"`
	Model      string `json:"model"`
	StopReason string `json:"stop_reason"`
	Content    []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	Usage struct {
		InputTokens  *int `json:"input_tokens"`
		OutputTokens *int `json:"output_tokens"`
	} `json:"usage"`
}

func TestMessage(t *testing.T) {
	h := NewHandler(Config{ReplyTokens: 5, Now: newClock().Now})
	for _, tc := range []struct {
		maxTokens int
		output    int
		stop      string
	}{{100, 5, "end_turn"}, {3, 3, "max_tokens"}} {
		w := messages(h, hello("Say hello", tc.maxTokens))
		require.Equal(t, http.StatusOK, w.Code, w.Body.String())
		assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
		var m message
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &m))
		assert.True(t, strings.HasPrefix(m.ID, "msg_llmtest_"), m.ID)
		assert.Equal(t, "message", m.Type)
		assert.Equal(t, "assistant", m.Role)
		assert.Equal(t, "claude-test", m.Model)
		assert.Equal(t, tc.stop, m.StopReason)
		require.Len(t, m.Content, 1)
		assert.Equal(t, "text", m.Content[0].Type)
		assert.Equal(t, reply(tc.output), m.Content[0].Text)
		require.NotNil(t, m.Usage.InputTokens)
		assert.Equal(t, 3+3, *m.Usage.InputTokens, "⌈9/4⌉ + 3")
		assert.Equal(t, tc.output, *m.Usage.OutputTokens)
	}
	st := h.Stats()
	assert.EqualValues(t, 2, st.Accepted)
	assert.EqualValues(t, 12, st.PromptTokens)
	assert.EqualValues(t, 8, st.CompletionTokens)
	assert.EqualValues(t, 20, st.TotalTokens)
}

// sseEvent is one server-sent event of a Messages stream.
type sseEvent struct {
	name string
	data map[string]any
}

// sseEvents parses a Messages stream.
func sseEvents(t *testing.T, body string) []sseEvent {
	t.Helper()
	var evs []sseEvent
	for _, block := range strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		name, data, ok := strings.Cut(block, "\n")
		require.True(t, ok, block)
		require.True(t, strings.HasPrefix(name, "event: ") && strings.HasPrefix(data, "data: "), block)
		ev := sseEvent{name: strings.TrimPrefix(name, "event: ")}
		require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(data, "data: ")), &ev.data))
		assert.Equal(t, ev.name, ev.data["type"], "event and type agree")
		evs = append(evs, ev)
	}
	return evs
}

func TestMessageStream(t *testing.T) {
	h := NewHandler(Config{ReplyTokens: 3, Now: newClock().Now})
	w := messages(h, `{"model":"claude-test","max_tokens":2,"stream":true,"system":"Be brief.","messages":[{"role":"user","content":"Hello"}]}`)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.Equal(t, "text/event-stream", w.Header().Get("Content-Type"))
	evs := sseEvents(t, w.Body.String())
	var names []string
	for _, ev := range evs {
		names = append(names, ev.name)
	}
	require.Equal(t, []string{"message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta",
		"content_block_stop", "message_delta", "message_stop"}, names)
	start := evs[0].data["message"].(map[string]any)
	assert.Equal(t, "message", start["type"])
	assert.Equal(t, "claude-test", start["model"])
	assert.Nil(t, start["stop_reason"])
	assert.Equal(t, map[string]any{"input_tokens": 7.0, "output_tokens": 1.0}, start["usage"])
	assert.Equal(t, map[string]any{"type": "text", "text": ""}, evs[1].data["content_block"])
	var text string
	for _, ev := range evs[3:5] {
		d := ev.data["delta"].(map[string]any)
		assert.Equal(t, "text_delta", d["type"])
		text += d["text"].(string)
	}
	assert.Equal(t, reply(2), text)
	assert.Equal(t, map[string]any{"stop_reason": "max_tokens", "stop_sequence": nil}, evs[6].data["delta"])
	assert.Equal(t, map[string]any{"output_tokens": 2.0}, evs[6].data["usage"],
		"the output alone: a usage merged over message_start's keeps its input")
}

// TestOutputTokensGivenBack: max_tokens is taken from the output limit at
// admission and what the reply leaves unused is given back at its end, as
// Anthropic says it counts: the headers at admission show the cap taken.
func TestOutputTokensGivenBack(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit Limit
	}{
		{"token bucket", TokenBucket(100, time.Minute, 100)},
		{"fixed window", FixedWindow(100, time.Minute)},
		{"sliding window", SlidingWindow(100, time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			h := NewHandler(Config{ReplyTokens: 10, OutputTokens: tc.limit, Headers: AnthropicHeaders, Now: clk.Now})
			w := messages(h, hello("hi", 60))
			require.Equal(t, http.StatusOK, w.Code)
			assert.Equal(t, "40", w.Header().Get("Anthropic-Ratelimit-Output-Tokens-Remaining"), "60 taken")
			w = messages(h, hello("hi", 60))
			require.Equal(t, http.StatusOK, w.Code, "50 of the first 60 given back")
			assert.Equal(t, "30", w.Header().Get("Anthropic-Ratelimit-Output-Tokens-Remaining"))
			w = messages(h, hello("hi", 81))
			require.Equal(t, http.StatusTooManyRequests, w.Code, "80 left")
			e := anthropicError(t, w)
			assert.Equal(t, "rate_limit_error", e.Error.Type)
			assert.Contains(t, e.Error.Message, "output tokens")
			assert.Equal(t, [4]int64{OutputTokens: 1}, h.Stats().RejectedBy)
			assert.Equal(t, "80", w.Header().Get("Anthropic-Ratelimit-Output-Tokens-Remaining"))
			assert.EqualValues(t, 20, h.MaxInWindow(OutputTokens, time.Minute), "what stays charged")
			require.Equal(t, http.StatusOK, messages(h, hello("hi", 80)).Code)
		})
	}
}

func TestInputAndOutputLimits(t *testing.T) {
	clk := newClock()
	h := NewHandler(Config{ReplyTokens: 10, RetryAfterMs: true,
		Requests:     TokenBucket(50, time.Minute, 50),
		InputTokens:  TokenBucket(600, time.Minute, 600),
		OutputTokens: TokenBucket(60, time.Minute, 60),
		Headers:      AnthropicHeaders, Now: clk.Now})
	long := strings.Repeat("x", 1188) // 297 + 3 = 300 input tokens
	require.Equal(t, http.StatusOK, messages(h, hello(long, 20)).Code)
	w := messages(h, hello(long, 20))
	require.Equal(t, http.StatusOK, w.Code)
	for k, v := range map[string]string{
		"Anthropic-Ratelimit-Requests-Limit":          "50",
		"Anthropic-Ratelimit-Requests-Remaining":      "48",
		"Anthropic-Ratelimit-Requests-Reset":          "2025-01-01T00:00:03Z", // 2 requests in 2.4 s
		"Anthropic-Ratelimit-Input-Tokens-Limit":      "600",
		"Anthropic-Ratelimit-Input-Tokens-Remaining":  "0",
		"Anthropic-Ratelimit-Input-Tokens-Reset":      "2025-01-01T00:01:00Z",
		"Anthropic-Ratelimit-Output-Tokens-Limit":     "60",
		"Anthropic-Ratelimit-Output-Tokens-Remaining": "30", // 10 of the first 20 given back
		"Anthropic-Ratelimit-Output-Tokens-Reset":     "2025-01-01T00:00:30Z",
		// The most restrictive of the two: the input, with nothing left.
		"Anthropic-Ratelimit-Tokens-Limit":     "600",
		"Anthropic-Ratelimit-Tokens-Remaining": "0",
		"Anthropic-Ratelimit-Tokens-Reset":     "2025-01-01T00:01:00Z",
	} {
		assert.Equal(t, v, w.Header().Get(k), k)
	}
	w = messages(h, hello("abcd", 5)) // 4 input tokens: 0.4 s
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "rate_limit_error", anthropicError(t, w).Error.Type)
	assert.Equal(t, "1", w.Header().Get("Retry-After"), "whole seconds, rounded up")
	assert.Equal(t, "400", w.Header().Get("Retry-After-Ms"))
	assert.Contains(t, anthropicError(t, w).Error.Message, "600 input tokens")

	clk.Advance(50 * time.Second) // 500 input tokens, 50 output
	w = messages(h, hello("abcd", 50))
	require.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "496", w.Header().Get("Anthropic-Ratelimit-Input-Tokens-Remaining"))
	assert.Equal(t, "10", w.Header().Get("Anthropic-Ratelimit-Output-Tokens-Remaining"))
	assert.Equal(t, "10", w.Header().Get("Anthropic-Ratelimit-Tokens-Remaining"), "now the output")
	assert.Equal(t, "60", w.Header().Get("Anthropic-Ratelimit-Tokens-Limit"))

	assert.EqualValues(t, 604, h.MaxInWindow(InputTokens, time.Minute))
	assert.EqualValues(t, 30, h.MaxInWindow(OutputTokens, time.Minute))
}

func TestTokensHeaderOfTheTokensLimitAlone(t *testing.T) {
	h := NewHandler(Config{ReplyTokens: 10, Tokens: TokenBucket(100, time.Minute, 100),
		Headers: AnthropicHeaders | OpenAIHeaders | IETFHeaders, Now: newClock().Now})
	w := messages(h, hello("abcd", 20)) // 4 + 10 tokens
	require.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "86", w.Header().Get("Anthropic-Ratelimit-Tokens-Remaining"))
	assert.Equal(t, "86", w.Header().Get("X-Ratelimit-Remaining-Tokens"))
	assert.Empty(t, w.Header().Get("Anthropic-Ratelimit-Input-Tokens-Remaining"), "not limited")
}

func TestInputAndOutputNotInOtherStyles(t *testing.T) {
	h := NewHandler(Config{InputTokens: TokenBucket(100, time.Minute, 100), OutputTokens: TokenBucket(100, time.Minute, 100),
		Headers: OpenAIHeaders | IETFHeaders, Now: newClock().Now})
	w := messages(h, hello("abcd", 20))
	require.Equal(t, http.StatusOK, w.Code)
	for k := range w.Header() {
		assert.NotContains(t, strings.ToLower(k), "ratelimit", "OpenAI and the IETF have no names for them")
	}
}

func TestChatCompletionCountsInputAndOutput(t *testing.T) {
	clk := newClock()
	h := NewHandler(Config{ReplyTokens: 10, InputTokens: TokenBucket(100, time.Minute, 100),
		OutputTokens: TokenBucket(100, time.Minute, 100), Headers: AnthropicHeaders, Now: clk.Now})
	w := chat(t, h, userMessage("abcd", 50)) // 1 + 3 prompt tokens
	require.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "96", w.Header().Get("Anthropic-Ratelimit-Input-Tokens-Remaining"))
	assert.Equal(t, "50", w.Header().Get("Anthropic-Ratelimit-Output-Tokens-Remaining"))
	w = chat(t, h, userMessage("abcd", 0)) // the cap is ReplyTokens
	require.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "80", w.Header().Get("Anthropic-Ratelimit-Output-Tokens-Remaining"), "40 given back")
}

func TestInvalidMessagesAreNotCounted(t *testing.T) {
	h := NewHandler(Config{Requests: TokenBucket(1, time.Hour, 1), Now: newClock().Now})
	for _, tc := range []struct {
		method, body string
		status       int
		msg          string
	}{
		{http.MethodPost, `{`, http.StatusBadRequest, "unexpected EOF"},
		{http.MethodPost, `{"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, http.StatusBadRequest, "model"},
		{http.MethodPost, `{"model":"c","messages":[{"role":"user","content":"hi"}]}`, http.StatusBadRequest, "max_tokens"},
		{http.MethodPost, `{"model":"c","max_tokens":-1,"messages":[{"role":"user","content":"hi"}]}`, http.StatusBadRequest, "max_tokens"},
		{http.MethodPost, `{"model":"c","max_tokens":1,"messages":[]}`, http.StatusBadRequest, "messages"},
		{http.MethodPost, `{"model":"c","max_tokens":1,"messages":[{"role":"user","content":7}]}`, http.StatusBadRequest, "content"},
		{http.MethodGet, ``, http.StatusMethodNotAllowed, "use POST"},
	} {
		w := send(h, tc.method, "/v1/messages", tc.body)
		require.Equal(t, tc.status, w.Code, tc.body)
		e := anthropicError(t, w)
		assert.Equal(t, "invalid_request_error", e.Error.Type)
		assert.Contains(t, e.Error.Message, tc.msg)
	}
	assert.Equal(t, Stats{Invalid: 7}, h.Stats())
	assert.Equal(t, http.StatusOK, messages(h, hello("hi", 5)).Code, "the limit is whole")
}

func TestMessageTooLarge(t *testing.T) {
	h := NewHandler(Config{OutputTokens: TokenBucket(100, time.Minute, 100), Headers: AnthropicHeaders, Now: newClock().Now})
	w := messages(h, hello("hi", 101))
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Empty(t, w.Header().Get("Retry-After"), "waiting will not help")
	assert.Equal(t, "This request can never fit the rate limit of 100 output tokens (token bucket 100 per 1m0s, burst 100): it requests 101.",
		anthropicError(t, w).Error.Message)
}

func TestMessageFaults(t *testing.T) {
	for _, tc := range []struct {
		f      Fault
		status int
		typ    string
	}{
		{Overloaded, 529, "overloaded_error"},
		{Unavailable, http.StatusServiceUnavailable, "api_error"},
		{QuotaExhausted, http.StatusBadRequest, "invalid_request_error"},
		{Fault(99), http.StatusInternalServerError, "api_error"},
	} {
		h := NewHandler(Config{Fault: func(time.Time) Fault { return tc.f }})
		w := messages(h, hello("hi", 5))
		assert.Equal(t, tc.status, w.Code)
		assert.Equal(t, tc.typ, anthropicError(t, w).Error.Type)
		assert.Equal(t, Stats{Faulted: 1}, h.Stats())
	}
}

// TestResetWhileAResponseRuns: a give-back for an admission from before a
// Reset is void.
func TestResetWhileAResponseRuns(t *testing.T) {
	h := NewHandler(Config{ReplyTokens: 1, Latency: 100 * time.Millisecond,
		OutputTokens: SlidingWindow(100, time.Minute), Headers: AnthropicHeaders})
	var wg sync.WaitGroup
	wg.Go(func() { assert.Equal(t, http.StatusOK, messages(h, hello("hi", 50)).Code) })
	for h.Stats().Accepted == 0 {
		time.Sleep(time.Millisecond)
	}
	h.Reset()
	wg.Wait()
	w := messages(h, hello("hi", 1))
	require.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "99", w.Header().Get("Anthropic-Ratelimit-Output-Tokens-Remaining"))
}

func FuzzMessages(f *testing.F) {
	f.Add(hello("hi", 5))
	f.Add(`{"model":"c","max_tokens":3,"stream":true,"system":[{"type":"text","text":"x"}],"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"y"}]}]}],"tools":[{}]}`)
	f.Add(`{"model":"c","max_tokens":1e9,"messages":[{"content":null}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		h := NewHandler(Config{ReplyTokens: 4, OutputTokens: TokenBucket(100, time.Minute, 100),
			InputTokens: SlidingWindow(100, time.Minute), Headers: AnthropicHeaders, Now: newClock().Now})
		w := messages(h, body)
		switch w.Code {
		case http.StatusOK:
		case http.StatusBadRequest, http.StatusTooManyRequests:
			anthropicError(t, w)
		default:
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		st := h.Stats()
		require.Equal(t, int64(1), st.Accepted+st.Rejected+st.Invalid)
	})
}
