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
)

// messagesPath ends the path of Anthropic's Messages API.
const messagesPath = "/v1/messages"

// MessagesRequest is the part of an Anthropic Messages API request the fake
// reads; other fields are ignored.
type MessagesRequest struct {
	Model string `json:"model"`
	// MaxTokens caps the completion; Anthropic requires it.
	MaxTokens int            `json:"max_tokens"`
	System    Content        `json:"system,omitempty"`
	Messages  []MessageParam `json:"messages"`
	// Tools are the tools' definitions, counted as sent.
	Tools  []json.RawMessage `json:"tools,omitempty"`
	Stream bool              `json:"stream,omitempty"`
}

// MessageParam is one message of a MessagesRequest.
type MessageParam struct {
	Role    string  `json:"role"`
	Content Content `json:"content"`
}

// Content is the text that counts of an Anthropic content field: in JSON a
// string, null, or an array of content blocks, of which are joined
// (without separator) the text of the text blocks, the thinking of the
// thinking blocks, the input of the tool_use blocks as sent (JSON), and the
// content of the tool_result blocks (itself a string or blocks); images,
// documents and other blocks count nothing.
type Content string

// UnmarshalJSON implements json.Unmarshaler, accepting every form Content
// documents.
func (c *Content) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case len(data) == 0 || string(data) == "null":
		*c = ""
		return nil
	case data[0] != '[':
		var s string
		err := json.Unmarshal(data, &s)
		*c = Content(s)
		return err
	}
	var blocks []struct {
		Type     string          `json:"type"`
		Text     string          `json:"text"`
		Thinking string          `json:"thinking"`
		Input    json.RawMessage `json:"input"`
		Content  Content         `json:"content"`
	}
	if err := json.Unmarshal(data, &blocks); err != nil {
		return err
	}
	var b strings.Builder
	for _, bl := range blocks {
		switch bl.Type {
		case "text":
			b.WriteString(bl.Text)
		case "thinking":
			b.WriteString(bl.Thinking)
		case "tool_use":
			b.Write(bl.Input)
		case "tool_result":
			b.WriteString(string(bl.Content))
		}
	}
	*c = Content(b.String())
	return nil
}

// MessageInputTokens returns the number of input tokens the fake counts for
// req, by the rule of PromptTokens: the Unicode code points of its system
// prompt, of its messages' contents and of its tools' definitions (their
// JSON as sent) divided by 4, rounded up, plus 3 per message. A system
// prompt "Be brief." and one message "Hello" count ⌈14/4⌉ + 3 = 7.
func MessageInputTokens(req MessagesRequest) int {
	chars := utf8.RuneCountInString(string(req.System))
	for _, m := range req.Messages {
		chars += utf8.RuneCountInString(string(m.Content))
	}
	for _, t := range req.Tools {
		chars += utf8.RuneCount(t)
	}
	return (chars+3)/4 + 3*len(req.Messages)
}

// validate returns what makes req unanswerable, as Anthropic would say it.
func (req *MessagesRequest) validate() error {
	switch {
	case req.Model == "":
		return errors.New("model: Field required")
	case req.MaxTokens == 0:
		return errors.New("max_tokens: Field required")
	case req.MaxTokens < 0:
		return errors.New("max_tokens: Input should be greater than or equal to 1")
	case len(req.Messages) == 0:
		return errors.New("messages: at least one message is required")
	}
	return nil
}

// serveMessages answers r, sent to the Messages API (see Handler).
func (h *Handler) serveMessages(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Fault != nil {
		if f := h.cfg.Fault(h.now()); f != NoFault {
			h.count(&h.stats.Faulted)
			writeAnthropicFault(w, f)
			return
		}
	}
	if r.Method != http.MethodPost {
		h.count(&h.stats.Invalid)
		w.Header().Set("Allow", http.MethodPost)
		writeAnthropicError(w, http.StatusMethodNotAllowed, "invalid_request_error",
			"Method "+r.Method+" not allowed; use POST.")
		return
	}
	var req MessagesRequest
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&req)
	if err == nil {
		err = req.validate()
	}
	if err != nil {
		h.count(&h.stats.Invalid)
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	a := &answer{id: "msg_llmtest_", model: req.Model, prompt: MessageInputTokens(req),
		completion: min(h.cfg.ReplyTokens, req.MaxTokens), finish: "end_turn"}
	if a.completion < h.cfg.ReplyTokens {
		a.finish = "max_tokens"
	}
	cost := h.cost(a, req.MaxTokens)
	d := h.admit(cost, a)
	h.cfg.Headers.write(w.Header(), &d.quotas, d.now)
	if d.refused {
		q := d.quotas[d.dim]
		what := strings.ReplaceAll(d.dim.String(), "_", " ")
		msg := fmt.Sprintf("This request would exceed the rate limit of %d %s (%v), "+
			"requesting %d; see the response headers for current usage. Please try again later.",
			q.limit.capacity(), what, q.limit, cost[d.dim])
		if d.wait == 0 {
			msg = fmt.Sprintf("This request can never fit the rate limit of %d %s (%v): it requests %d.",
				q.limit.capacity(), what, q.limit, cost[d.dim])
		} else {
			h.setRetryAfter(w.Header(), d.wait)
		}
		writeAnthropicError(w, http.StatusTooManyRequests, "rate_limit_error", msg)
		return
	}
	if req.Stream {
		a.writeMessageStream(w, r, h.cfg.Latency, h.cfg.TokenLatency)
	} else {
		a.writeMessage(w, r, h.cfg.Latency, h.cfg.TokenLatency)
	}
	h.giveBack(&d, cost[OutputTokens]-int64(a.completion))
}

// JSON shapes of Anthropic's Messages API.
type (
	anthropicErrorJSON struct {
		Type  string `json:"type"` // "error"
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	anthropicMessageJSON struct {
		ID           string             `json:"id"`
		Type         string             `json:"type"` // "message"
		Role         string             `json:"role"`
		Model        string             `json:"model"`
		Content      []contentBlockJSON `json:"content"`
		StopReason   *string            `json:"stop_reason"`
		StopSequence *string            `json:"stop_sequence"`
		Usage        messageUsageJSON   `json:"usage"`
	}
	contentBlockJSON struct {
		Type string `json:"type"` // "text"
		Text string `json:"text"`
	}
	messageUsageJSON struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	}
)

// writeAnthropicError answers an Anthropic error.
func writeAnthropicError(w http.ResponseWriter, status int, typ, msg string) {
	e := anthropicErrorJSON{Type: "error"}
	e.Error.Type, e.Error.Message = typ, msg
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(e)
}

// writeAnthropicFault answers f as Anthropic does.
func writeAnthropicFault(w http.ResponseWriter, f Fault) {
	switch f {
	case Overloaded:
		writeAnthropicError(w, 529, "overloaded_error", "Overloaded")
	case Unavailable:
		writeAnthropicError(w, http.StatusServiceUnavailable, "api_error", "Service unavailable.")
	case QuotaExhausted:
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error",
			"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.")
	default:
		writeAnthropicError(w, http.StatusInternalServerError, "api_error", fmt.Sprintf("llmtest: unknown Fault(%d)", f))
	}
}

// message returns a as a Message with the content given.
func (a *answer) message(content []contentBlockJSON, stop *string, output int) anthropicMessageJSON {
	return anthropicMessageJSON{ID: a.id, Type: "message", Role: "assistant", Model: a.model, Content: content,
		StopReason: stop, Usage: messageUsageJSON{a.prompt, output}}
}

// writeMessage writes a as one Message after waiting latency plus
// tokenLatency per completion token.
func (a *answer) writeMessage(w http.ResponseWriter, r *http.Request, latency, tokenLatency time.Duration) {
	if !sleep(r, latency+time.Duration(a.completion)*tokenLatency) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(a.message([]contentBlockJSON{{"text", reply(a.completion)}}, &a.finish, a.completion))
}

// writeMessageStream writes a as Anthropic's server-sent events, flushing
// each: after latency, message_start (its usage the input and 1 output
// token), content_block_start, ping, one content_block_delta per
// completion token, tokenLatency apart, content_block_stop, message_delta
// (the stop reason, and the usage: the output tokens), message_stop.
func (a *answer) writeMessageStream(w http.ResponseWriter, r *http.Request, latency, tokenLatency time.Duration) {
	if !sleep(r, latency) {
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	send := func(event string, data any) bool {
		b, err := json.Marshal(data)
		if err == nil {
			_, err = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
		}
		if err == nil {
			// An unflushable writer buffers the stream: fine for recorders.
			if ferr := rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
				err = ferr
			}
		}
		return err == nil
	}
	type obj = map[string]any
	if !send("message_start", obj{"type": "message_start", "message": a.message([]contentBlockJSON{}, nil, 1)}) ||
		!send("content_block_start", obj{"type": "content_block_start", "index": 0, "content_block": contentBlockJSON{"text", ""}}) ||
		!send("ping", obj{"type": "ping"}) {
		return
	}
	content := reply(a.completion)
	for i := 0; i < len(content); i += 4 {
		delta := obj{"type": "content_block_delta", "index": 0, "delta": obj{"type": "text_delta", "text": content[i : i+4]}}
		if !sleep(r, tokenLatency) || !send("content_block_delta", delta) {
			return
		}
	}
	if !send("content_block_stop", obj{"type": "content_block_stop", "index": 0}) ||
		!send("message_delta", obj{"type": "message_delta",
			"delta": obj{"stop_reason": a.finish, "stop_sequence": nil},
			"usage": obj{"output_tokens": a.completion}}) {
		return
	}
	send("message_stop", obj{"type": "message_stop"})
}
