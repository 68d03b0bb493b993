package llmclient_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/llmfixture"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
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

// TestAnthropicPresetAgainstTheFake: through the Anthropic preset, a bucket
// limited as Anthropic limits keeps what the fake's limits hold, dimension
// by dimension, for a message and a stream: charged the estimate and
// max_tokens, told the remaining input and output tokens by the headers,
// reconciled with the usage; the tokens-* headers, the most restrictive of
// the two, reach no dimension of the bucket.
func TestAnthropicPresetAgainstTheFake(t *testing.T) {
	const rpm, itpm, otpm = 100, 10_000, 2_000
	api := llmtest.NewServer(llmtest.Config{ReplyTokens: 20, Headers: llmtest.AnthropicHeaders,
		Requests:     llmtest.TokenBucket(rpm, time.Minute, rpm),
		InputTokens:  llmtest.TokenBucket(itpm, time.Minute, itpm),
		OutputTokens: llmtest.TokenBucket(otpm, time.Minute, otpm)})
	defer api.Close()
	b := bucket.NewLocal(bucket.PerMinute(rpm), bucket.WithLimit(bucket.InputTokens, bucket.PerMinute(itpm)),
		bucket.WithLimit(bucket.OutputTokens, bucket.PerMinute(otpm)), bucket.WithClock(llmfixture.Frozen{}))
	tr := transport.New(nil, llmclient.Anthropic(b))
	hc := &http.Client{Transport: tr}
	key := api.AnthropicURL + "#" + transport.Fingerprint("sk-ant") + "/claude-test"
	system := strings.Repeat("s", 4000)
	var input, output int
	for i, stream := range []bool{false, true} {
		body := `{"model":"claude-test","max_tokens":500,"stream":` + strconv.FormatBool(stream) +
			`,"system":[{"type":"text","text":"` + system + `"}],"messages":[{"role":"user","content":"Say hello"}]}`
		req, err := http.NewRequest("POST", api.AnthropicURL+"/v1/messages", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("X-Api-Key", "sk-ant")
		resp, err := hc.Do(req)
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, strconv.Itoa(otpm-output-500), resp.Header.Get("Anthropic-Ratelimit-Output-Tokens-Remaining"),
			"max_tokens taken at admission")
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		input += 1003 + 3 // ⌈4009/4⌉ + 3 a message
		output += 20
		st := api.Stats()
		assert.EqualValues(t, input, st.PromptTokens)
		assert.EqualValues(t, output, st.CompletionTokens)
		// The fake refills in real time, the bucket not at all: within a
		// few tokens of a second's refill.
		got := b.Tokens(key)
		assert.Equal(t, float64(rpm-i-1), got[bucket.Requests], "call %d", i)
		assert.InDelta(t, itpm-input, got[bucket.InputTokens], 1, "call %d: reconciled with the input used", i)
		assert.InDelta(t, otpm-output, got[bucket.OutputTokens], 1, "call %d: reconciled with the output used", i)
		assert.NotContains(t, got, bucket.Tokens, "tokens-* has no dimension to reach")
	}
	st := tr.Stats()
	assert.Equal(t, 2*480.0, st.Refunded[bucket.OutputTokens], "max_tokens 500, 20 used")
	assert.Equal(t, 2*(1003+4-1006.0), st.Refunded[bucket.InputTokens], "the estimate counts 4 a message, the fake 3")
}
