package llmclient

import (
	"encoding/json"
	"net/http"
	"unicode/utf8"

	"github.com/sluicehq/sluice/bucket"
)

// imageTokens is what AnthropicCost counts for an image or a document
// block: Anthropic bills an image by its size, up to about 1,600 tokens.
const imageTokens = 1600

// AnthropicCost returns a cost function for transport.WithCost that charges
// an Anthropic Messages API request (POST /v1/messages) as Anthropic
// limits it, in three dimensions: {requests: 1, input_tokens: estimate,
// output_tokens: max_tokens}. Give the bucket limits for
// bucket.InputTokens and bucket.OutputTokens (Anthropic's input and output
// tokens per minute) and transport.WithUsage(MeterUsage), which reconciles
// each with the usage the response reports.
//
// The input estimate is coarse, and errs high: the characters of the
// system prompt, of the messages' text, tool_use, tool_result and thinking
// blocks, and of the tools' definitions, divided by 4, plus 4 per message,
// plus 1,600 per image or document. It reads the request from a copy of
// its body (GetBody), never from Body; a request it cannot read is charged
// {requests: 1}.
func AnthropicCost() func(*http.Request) bucket.Cost {
	return func(r *http.Request) bucket.Cost {
		in, out, ok := readMessagesRequest(r)
		if !ok {
			return bucket.Cost{bucket.Requests: 1}
		}
		return bucket.Cost{bucket.Requests: 1, bucket.InputTokens: float64(in), bucket.OutputTokens: float64(out)}
	}
}

// readMessagesRequest estimates the input tokens of the Messages API
// request r carries, from a copy of its body, and returns its max_tokens.
func readMessagesRequest(r *http.Request) (in, out int, ok bool) {
	if r.GetBody == nil || r.Body == nil || r.Body == http.NoBody {
		return 0, 0, false
	}
	body, err := r.GetBody()
	if err != nil {
		return 0, 0, false
	}
	defer body.Close()
	var req struct {
		System    json.RawMessage `json:"system"`
		MaxTokens int             `json:"max_tokens"`
		Messages  []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Tools []json.RawMessage `json:"tools"`
	}
	if json.NewDecoder(body).Decode(&req) != nil || len(req.Messages) == 0 {
		return 0, 0, false
	}
	chars, images := blocksText(req.System)
	for _, m := range req.Messages {
		c, i := blocksText(m.Content)
		chars, images = chars+c, images+i
	}
	for _, t := range req.Tools {
		chars += utf8.RuneCount(t) // name, description and schema, as sent
	}
	in = (chars+charsPerToken-1)/charsPerToken + tokensPerMessage*len(req.Messages) + imageTokens*images
	return in, max(req.MaxTokens, 0), true
}

// blocksText counts the characters of raw, a string or an array of content
// blocks, and its image and document blocks.
func blocksText(raw json.RawMessage) (chars, images int) {
	if len(raw) == 0 {
		return 0, 0
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return utf8.RuneCountInString(s), 0
	}
	var blocks []struct {
		Type     string          `json:"type"`
		Text     string          `json:"text"`
		Thinking string          `json:"thinking"`
		Input    json.RawMessage `json:"input"`   // tool_use
		Content  json.RawMessage `json:"content"` // tool_result: a string or blocks
	}
	if json.Unmarshal(raw, &blocks) != nil {
		return 0, 0
	}
	for _, b := range blocks {
		switch b.Type {
		case "image", "document":
			images++
		case "tool_result":
			c, i := blocksText(b.Content)
			chars, images = chars+c, images+i
		default:
			chars += utf8.RuneCountInString(b.Text) + utf8.RuneCountInString(b.Thinking) + utf8.RuneCount(b.Input)
		}
	}
	return chars, images
}
