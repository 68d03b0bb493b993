package llmtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/wait"
)

// ChatRequest is the part of an OpenAI chat completion request the fake
// reads; other fields are ignored.
type ChatRequest struct {
	Model    string    `json:"model"`
	Messages []Message `json:"messages"`
	// MaxTokens and MaxCompletionTokens cap the completion; the newer
	// MaxCompletionTokens wins if both are set. Zero means unset.
	MaxTokens           int            `json:"max_tokens,omitempty"`
	MaxCompletionTokens int            `json:"max_completion_tokens,omitempty"`
	Stream              bool           `json:"stream,omitempty"`
	StreamOptions       *StreamOptions `json:"stream_options,omitempty"`
}

// StreamOptions are a streamed request's options.
type StreamOptions struct {
	// IncludeUsage asks for a last chunk, with no choices, carrying usage.
	IncludeUsage bool `json:"include_usage"`
}

// Message is one message of a ChatRequest.
type Message struct {
	Role string `json:"role"`
	// Content is the message's text. In JSON it may be a string, null, or
	// an array of content parts, of which the text of those of type "text"
	// is joined (without separator) and the others ignored.
	Content string `json:"content"`
}

// UnmarshalJSON implements json.Unmarshaler, accepting every form of
// content Message documents.
func (m *Message) UnmarshalJSON(data []byte) error {
	var raw struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	*m = Message{Role: raw.Role}
	c := bytes.TrimSpace(raw.Content)
	switch {
	case len(c) == 0 || string(c) == "null":
		return nil
	case c[0] == '[':
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(c, &parts); err != nil {
			return err
		}
		var b strings.Builder
		for _, p := range parts {
			if p.Type == "text" {
				b.WriteString(p.Text)
			}
		}
		m.Content = b.String()
		return nil
	}
	return json.Unmarshal(c, &m.Content)
}

// PromptTokens returns the number of tokens the fake counts for req's
// prompt: the Unicode code points of all its messages' contents divided by
// 4, rounded up, plus 3 per message. Two messages "Hello" and "world!"
// count ⌈11/4⌉ + 2·3 = 9.
func PromptTokens(req ChatRequest) int {
	chars := 0
	for _, m := range req.Messages {
		chars += utf8.RuneCountInString(m.Content)
	}
	return (chars+3)/4 + 3*len(req.Messages)
}

// maxCompletion returns the cap req sets on its completion, 0 if none.
func (req *ChatRequest) maxCompletion() int {
	if req.MaxCompletionTokens > 0 {
		return req.MaxCompletionTokens
	}
	return req.MaxTokens
}

// validate returns what makes req unanswerable, as OpenAI would say it.
func (req *ChatRequest) validate() error {
	switch {
	case len(req.Messages) == 0:
		return errors.New("'messages' must contain at least one message")
	case req.MaxTokens < 0:
		return errors.New("'max_tokens' must be at least 1")
	case req.MaxCompletionTokens < 0:
		return errors.New("'max_completion_tokens' must be at least 1")
	}
	return nil
}

// lorem is the text of every reply, repeated as need be.
const lorem = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua. "

// reply returns a completion of n tokens by the rule of PromptTokens:
// the first 4n characters of lorem repeated.
func reply(n int) string {
	s := strings.Repeat(lorem, (4*n)/len(lorem)+1)
	return s[:4*n]
}

// answer is one admitted chat completion.
type answer struct {
	id         string
	model      string
	created    int64
	prompt     int
	completion int
	finish     string // "stop", or "length" if the cap cut the reply short
}

// JSON shapes of OpenAI's chat completion responses.
type (
	completionJSON struct {
		ID      string       `json:"id"`
		Object  string       `json:"object"`
		Created int64        `json:"created"`
		Model   string       `json:"model"`
		Choices []choiceJSON `json:"choices"`
		Usage   *usageJSON   `json:"usage,omitempty"`
	}
	choiceJSON struct {
		Index        int          `json:"index"`
		Message      *messageJSON `json:"message,omitempty"`
		Delta        *messageJSON `json:"delta,omitempty"`
		FinishReason *string      `json:"finish_reason"`
	}
	messageJSON struct {
		Role    string  `json:"role,omitempty"`
		Content *string `json:"content,omitempty"`
	}
	usageJSON struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	}
)

func (a *answer) usage() *usageJSON {
	return &usageJSON{a.prompt, a.completion, a.prompt + a.completion}
}

// writeJSON writes a as one chat.completion after waiting latency plus
// tokenLatency per completion token.
func (a *answer) writeJSON(w http.ResponseWriter, r *http.Request, latency, tokenLatency time.Duration) {
	if !sleep(r, latency+time.Duration(a.completion)*tokenLatency) {
		return
	}
	content := reply(a.completion)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(completionJSON{
		ID: a.id, Object: "chat.completion", Created: a.created, Model: a.model,
		Choices: []choiceJSON{{
			Message:      &messageJSON{Role: "assistant", Content: &content},
			FinishReason: &a.finish,
		}},
		Usage: a.usage(),
	})
}

// writeStream writes a as server-sent chat.completion.chunk events,
// flushing each: after latency, a first chunk with the role, then one chunk
// per completion token, tokenLatency apart, then one with the finish
// reason, then if usage one with no choices and the usage, then [DONE].
func (a *answer) writeStream(w http.ResponseWriter, r *http.Request, latency, tokenLatency time.Duration, usage bool) {
	if !sleep(r, latency) {
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	send := func(data any) bool {
		b, err := json.Marshal(data)
		if err == nil {
			_, err = fmt.Fprintf(w, "data: %s\n\n", b)
		}
		if err == nil {
			// An unflushable writer buffers the stream: fine for recorders.
			if ferr := rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
				err = ferr
			}
		}
		return err == nil
	}
	chunk := func(delta messageJSON, finish *string) completionJSON {
		return completionJSON{
			ID: a.id, Object: "chat.completion.chunk", Created: a.created, Model: a.model,
			Choices: []choiceJSON{{Delta: &delta, FinishReason: finish}},
		}
	}
	empty := ""
	if !send(chunk(messageJSON{Role: "assistant", Content: &empty}, nil)) {
		return
	}
	content := reply(a.completion)
	for i := 0; i < len(content); i += 4 {
		piece := content[i : i+4]
		if !sleep(r, tokenLatency) || !send(chunk(messageJSON{Content: &piece}, nil)) {
			return
		}
	}
	if !send(chunk(messageJSON{}, &a.finish)) {
		return
	}
	if usage {
		last := completionJSON{
			ID: a.id, Object: "chat.completion.chunk", Created: a.created, Model: a.model,
			Choices: []choiceJSON{}, Usage: a.usage(),
		}
		if !send(last) {
			return
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	rc.Flush()
}

// sleep waits d, real time, and reports whether r is still wanted.
func sleep(r *http.Request, d time.Duration) bool { return wait.Sleep(r.Context(), d) == nil }
