package llmclient_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
)

// TestAnthropicCost: a Messages API request is charged its input (system
// prompt, messages, tool blocks, tool definitions, images) and its output
// at max_tokens, in dimensions of their own. Before, Anthropic users had the
// OpenAI estimate: a 13,600-character system prompt was charged 262
// tokens, and input and output were one dimension, capped at the output
// rate.
func TestAnthropicCost(t *testing.T) {
	system := strings.Repeat("s", 13_600)
	for _, c := range []struct {
		name, body string
		want       bucket.Cost
	}{
		{"system and text", `{"model":"claude","max_tokens":1024,"system":"` + system + `",` +
			`"messages":[{"role":"user","content":"Say hello"}]}`,
			bucket.Cost{bucket.Requests: 1, bucket.InputTokens: 3400 + 3 + 4, bucket.OutputTokens: 1024}},
		{"blocks, tools and an image", `{"max_tokens":10,"system":[{"type":"text","text":"abcd"}],` +
			`"tools":[{"name":"f","input_schema":{}}],` +
			`"messages":[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image","source":{}}]},` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"abcdefgh"}]}]}`,
			// 4 + 4 + 7 ({"a":1}) + 8 + 30 (the tool, as sent) = 53 chars: 14 tokens; 3 messages; 1 image
			bucket.Cost{bucket.Requests: 1, bucket.InputTokens: 14 + 12 + 1600, bucket.OutputTokens: 10}},
		{"not a Messages request", `{"prompt":"x"}`, bucket.Cost{bucket.Requests: 1}},
		{"not JSON", `{`, bucket.Cost{bucket.Requests: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest("POST", "https://api.anthropic.com/v1/messages", strings.NewReader(c.body))
			assert.NoError(t, err)
			assert.Equal(t, c.want, llmclient.AnthropicCost()(req))
		})
	}
}
