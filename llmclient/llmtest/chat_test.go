package llmtest

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPromptTokens(t *testing.T) {
	for _, tc := range []struct {
		name, messages string
		want           int
	}{
		{"one string", `[{"role":"user","content":"Hello"}]`, 2 + 3},
		{"two strings", `[{"role":"system","content":"Hello"},{"role":"user","content":"world!"}]`, 3 + 6},
		{"text parts", `[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"e"}]}]`, 2 + 3},
		{"null content", `[{"role":"assistant","content":null}]`, 3},
		{"no content", `[{"role":"assistant"}]`, 3},
		{"code points, not bytes", `[{"role":"user","content":"héllo wörld €"}]`, 4 + 3},
		{"empty", `[]`, 0},
	} {
		var req ChatRequest
		require.NoError(t, json.Unmarshal([]byte(`{"messages":`+tc.messages+`}`), &req), tc.name)
		assert.Equal(t, tc.want, PromptTokens(req), tc.name)
	}
	assert.Equal(t, "abcde", func() string {
		var m Message
		require.NoError(t, json.Unmarshal([]byte(`{"role":"user","content":[{"type":"text","text":"abc"},{"type":"text","text":"de"}]}`), &m))
		return m.Content
	}())
	var m Message
	assert.Error(t, json.Unmarshal([]byte(`{"content":42}`), &m))
	assert.Error(t, json.Unmarshal([]byte(`{"content":[42]}`), &m))
}

// completion is what the tests read of a chat completion or chunk.
type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usageJSON `json:"usage"`
}

func TestChatCompletion(t *testing.T) {
	for _, tc := range []struct {
		name       string
		req        ChatRequest
		completion int
		finish     string
	}{
		{"reply tokens", userMessage("abcdefgh", 0), 10, "stop"},
		{"max_tokens above", userMessage("abcdefgh", 50), 10, "stop"},
		{"max_tokens below", userMessage("abcdefgh", 4), 4, "length"},
		{"max_completion_tokens wins", ChatRequest{
			Messages: []Message{{Role: "user", Content: "abcdefgh"}}, MaxTokens: 3, MaxCompletionTokens: 7,
		}, 7, "length"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			h := NewHandler(Config{ReplyTokens: 10, Now: clk.Now})
			w := chat(t, h, tc.req)
			require.Equal(t, http.StatusOK, w.Code, w.Body.String())
			assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
			var c completion
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &c))
			assert.Equal(t, "chatcmpl-llmtest-1", c.ID)
			assert.Equal(t, "chat.completion", c.Object)
			assert.Equal(t, epoch.Unix(), c.Created)
			assert.Equal(t, tc.req.Model, c.Model)
			require.Len(t, c.Choices, 1)
			require.NotNil(t, c.Choices[0].Message)
			assert.Equal(t, "assistant", c.Choices[0].Message.Role)
			content := c.Choices[0].Message.Content
			assert.Len(t, content, 4*tc.completion)
			assert.True(t, strings.HasPrefix(lorem, content))
			assert.Equal(t, tc.finish, *c.Choices[0].FinishReason)
			prompt := 2 + 3
			assert.Equal(t, &usageJSON{prompt, tc.completion, prompt + tc.completion}, c.Usage)
			assert.Equal(t, tc.completion, PromptTokens(ChatRequest{Messages: []Message{{Content: content}}})-3,
				"a reply counts its length by the prompt rule")
		})
	}
}

func TestReplyLongerThanLorem(t *testing.T) {
	assert.Len(t, reply(1000), 4000)
	assert.Equal(t, lorem+lorem[:4], reply(len(lorem)/4+1))
}

// events splits an SSE body into the data of its events, checking that
// every event is one data line followed by a blank line.
func events(t *testing.T, body string) []string {
	t.Helper()
	require.True(t, strings.HasSuffix(body, "\n\n"), body)
	var data []string
	for ev := range strings.SplitSeq(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		d, ok := strings.CutPrefix(ev, "data: ")
		require.True(t, ok, ev)
		require.NotContains(t, d, "\n")
		data = append(data, d)
	}
	return data
}

func TestChatStream(t *testing.T) {
	for _, usage := range []bool{false, true} {
		clk := newClock()
		h := NewHandler(Config{ReplyTokens: 5, Now: clk.Now})
		req := userMessage("abcd", 3)
		req.Stream = true
		if usage {
			req.StreamOptions = &StreamOptions{IncludeUsage: true}
		}
		w := chat(t, h, req)
		require.Equal(t, http.StatusOK, w.Code)
		assert.Equal(t, "text/event-stream", w.Header().Get("Content-Type"))
		assert.True(t, w.Flushed)

		data := events(t, w.Body.String())
		want := 1 + 3 + 1 + 1 // role, tokens, finish, [DONE]
		if usage {
			want++
		}
		require.Len(t, data, want)
		assert.Equal(t, "[DONE]", data[len(data)-1])
		var content strings.Builder
		for i, d := range data[:len(data)-1] {
			var c completion
			require.NoError(t, json.Unmarshal([]byte(d), &c), d)
			assert.Equal(t, "chatcmpl-llmtest-1", c.ID)
			assert.Equal(t, "chat.completion.chunk", c.Object)
			assert.Equal(t, "gpt-test", c.Model)
			switch {
			case i == 0:
				require.Len(t, c.Choices, 1)
				assert.Equal(t, "assistant", c.Choices[0].Delta.Role)
				assert.Equal(t, "", *c.Choices[0].Delta.Content)
				assert.Nil(t, c.Choices[0].FinishReason)
			case i <= 3:
				require.Len(t, c.Choices, 1)
				assert.Len(t, *c.Choices[0].Delta.Content, 4, "one token a chunk")
				content.WriteString(*c.Choices[0].Delta.Content)
				assert.Nil(t, c.Choices[0].FinishReason)
			case i == 4:
				require.Len(t, c.Choices, 1)
				assert.Nil(t, c.Choices[0].Delta.Content)
				assert.Equal(t, "length", *c.Choices[0].FinishReason)
				assert.Nil(t, c.Usage)
			default:
				assert.NotNil(t, c.Choices, "choices is [], not null")
				assert.Empty(t, c.Choices)
				assert.Equal(t, &usageJSON{1 + 3, 3, 7}, c.Usage)
			}
		}
		assert.Equal(t, lorem[:12], content.String())
		assert.EqualValues(t, 7, h.Stats().TotalTokens)
	}
}

func TestInvalidRequestsAreNotCounted(t *testing.T) {
	h := NewHandler(Config{Requests: FixedWindow(1, time.Minute), Now: newClock().Now})
	for _, tc := range []struct {
		name, method, body string
		status             int
		msg                string
	}{
		{"not JSON", http.MethodPost, `{"messages":`, http.StatusBadRequest, "Invalid request: unexpected EOF"},
		{"not a chat request", http.MethodPost, `{"messages":"hi"}`, http.StatusBadRequest, "Invalid request: json: cannot unmarshal"},
		{"no messages", http.MethodPost, `{"model":"m","messages":[]}`, http.StatusBadRequest, "at least one message"},
		{"negative max_tokens", http.MethodPost, `{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}`, http.StatusBadRequest, "'max_tokens' must be at least 1"},
		{"GET", http.MethodGet, ``, http.StatusMethodNotAllowed, "Method GET not allowed"},
	} {
		w := send(h, tc.method, "/v1/chat/completions", tc.body)
		assert.Equal(t, tc.status, w.Code, tc.name)
		e := apiError(t, w)
		assert.Equal(t, "invalid_request_error", e.Error.Type, tc.name)
		assert.Contains(t, e.Error.Message, tc.msg, tc.name)
	}
	assert.Equal(t, http.StatusOK, chat(t, h, userMessage("x", 0)).Code, "the limit is untouched")
	assert.Equal(t, Stats{Accepted: 1, Invalid: 5, ChargedTokens: 20, PromptTokens: 4, CompletionTokens: 16, TotalTokens: 20}, h.Stats())
}

func TestPlainEndpoint(t *testing.T) {
	h := NewHandler(Config{
		Requests: SlidingWindow(3, time.Second),
		Tokens:   SlidingWindow(1, time.Second),
		Now:      newClock().Now,
	})
	for _, r := range []struct{ method, path string }{
		{http.MethodGet, "/"},
		{http.MethodPost, "/v1/anything"},
		{http.MethodDelete, "/v1/chat"},
	} {
		w := send(h, r.method, r.path, "{}")
		assert.Equal(t, http.StatusOK, w.Code, r)
		assert.Equal(t, "ok", w.Body.String(), r)
		assert.Equal(t, "text/plain; charset=utf-8", w.Header().Get("Content-Type"), r)
	}
	assert.Equal(t, http.StatusTooManyRequests, get(h).Code, "one request each")
	assert.Equal(t, Stats{Accepted: 3, Rejected: 1, RejectedBy: [4]int64{Requests: 1}}, h.Stats(), "no tokens")
}

func TestLatency(t *testing.T) {
	h := NewHandler(Config{Latency: 20 * time.Millisecond, TokenLatency: 5 * time.Millisecond, ReplyTokens: 4})
	start := time.Now()
	w := chat(t, h, userMessage("x", 0))
	require.Equal(t, http.StatusOK, w.Code)
	assert.GreaterOrEqual(t, time.Since(start), 40*time.Millisecond)

	start = time.Now()
	require.Equal(t, http.StatusOK, get(h).Code)
	assert.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
}

func TestStreamStopsWhenTheClientLeaves(t *testing.T) {
	srv := NewServer(Config{ReplyTokens: 10000, TokenLatency: 10 * time.Millisecond}) // 100 s
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(line, "data: {"), line)
	cancel()
	resp.Body.Close()

	closed := make(chan struct{})
	go func() {
		srv.Close() // waits for the handler
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler kept streaming to nobody")
	}
}
