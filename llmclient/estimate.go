package llmclient

import (
	"encoding/json"
	"math"
	"net/http"
	"unicode/utf8"

	"github.com/sluicehq/sluice/bucket"
)

// Estimator returns how many tokens a chat completion will use in all,
// prompt and completion, before it is sent. Overestimates are refunded and
// underestimates debited once the response reports its usage; the charge
// must not exceed the tokens limit's burst, or the call fails at once.
type Estimator func(ChatRequest) int

// Default values of Estimate.
const (
	charsPerToken     = 4
	tokensPerMessage  = 4
	defaultCompletion = 1024
)

// Estimate is the default Estimator: the characters of the messages'
// content divided by 4, rounded up, plus 4 per message, plus the most the
// completion may take: MaxCompletionTokens, else MaxTokens, else 1024.
func Estimate(req ChatRequest) int {
	chars := 0
	for _, m := range req.Messages {
		chars += utf8.RuneCountInString(m.Content)
	}
	completion := req.MaxCompletionTokens
	if completion <= 0 {
		completion = req.MaxTokens
	}
	if completion <= 0 {
		completion = defaultCompletion
	}
	prompt := (chars+charsPerToken-1)/charsPerToken + tokensPerMessage*len(req.Messages)
	if completion > math.MaxInt-prompt {
		return math.MaxInt // a max_tokens no bucket admits, not one that overflows to nothing
	}
	return prompt + completion
}

// RequestCost returns a cost function for transport.WithCost that charges
// an OpenAI chat completion request {requests: 1, tokens: est(request)}
// (nil est: Estimate). It reads the request from a copy of its body, got
// from GetBody, and never from Body. Content given as an array of parts
// counts the text of its text parts. A request it cannot read (no GetBody,
// not JSON, no messages) is charged {requests: 1}; its tokens are debited
// once the response reports them, if the Transport has WithUsage.
func RequestCost(est Estimator) func(*http.Request) bucket.Cost {
	if est == nil {
		est = Estimate
	}
	return func(r *http.Request) bucket.Cost {
		req, ok := readChatRequest(r)
		if !ok {
			return bucket.Cost{bucket.Requests: 1}
		}
		return bucket.Cost{bucket.Requests: 1, bucket.Tokens: float64(max(est(req), 0))}
	}
}

// readChatRequest decodes the chat completion request r carries, from a
// copy of its body.
func readChatRequest(r *http.Request) (ChatRequest, bool) {
	if r.GetBody == nil || r.Body == nil || r.Body == http.NoBody {
		return ChatRequest{}, false
	}
	body, err := r.GetBody()
	if err != nil {
		return ChatRequest{}, false
	}
	defer body.Close()
	var w struct {
		ChatRequest
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(body).Decode(&w); err != nil || len(w.Messages) == 0 {
		return ChatRequest{}, false
	}
	req := w.ChatRequest
	req.Messages = make([]Message, len(w.Messages))
	for i, m := range w.Messages {
		req.Messages[i] = Message{Role: m.Role, Content: contentText(m.Content)}
	}
	return req, true
}

// contentText returns the text of a message's content: a string, or an
// array of parts of which the text parts count.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return ""
	}
	for _, p := range parts {
		if p.Type == "text" {
			s += p.Text
		}
	}
	return s
}
