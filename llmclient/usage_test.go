package llmclient_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/transport"
)

// meterResponse returns the meter MeterUsage gives a 200 of this content
// type.
func meterResponse(t *testing.T, contentType string) transport.UsageMeter {
	t.Helper()
	m := llmclient.MeterUsage(&http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {contentType}}})
	require.NotNil(t, m)
	return m
}

// readToEnd returns m's Cost once its body was read to the end: a
// transport.StreamMeter is told so first, as the Transport tells it at
// io.EOF.
func readToEnd(m transport.UsageMeter) (bucket.Cost, bool) {
	if sm, ok := m.(transport.StreamMeter); ok {
		sm.End()
	}
	return m.Cost()
}

// checkMeter feeds body to fresh meters whole, cut in two (anywhere, or at
// 256 places), and byte by byte, and checks they all find want (-1:
// nothing).
func checkMeter(t *testing.T, contentType, body string, want float64) {
	t.Helper()
	check := func(how string, pieces ...string) {
		t.Helper()
		m := meterResponse(t, contentType)
		for _, p := range pieces {
			n, err := m.Write([]byte(p))
			require.NoError(t, err)
			require.Equal(t, len(p), n)
		}
		c, ok := readToEnd(m)
		if want < 0 {
			assert.False(t, ok, "%s: found %v", how, c)
			return
		}
		if assert.True(t, ok, how) {
			assert.Equal(t, want, c[bucket.Tokens], how) // input and output: TestMeterUsageInputOutput
		}
	}
	check("whole", body)
	step := max(1, len(body)/256) // every cut of a short body
	for i := 1; i < len(body); i += step {
		check(fmt.Sprintf("cut at %d", i), body[:i], body[i:])
	}
	check("byte by byte", strings.Split(body, "")...)
}

func TestMeterUsageJSON(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       float64
	}{
		{"OpenAI", `{"id":"c","choices":[{"message":{"role":"assistant","content":"say \"usage\": {\"total_tokens\": 99} \\"}}],` +
			`"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`, 12},
		{"usage first, spaced", "{\n  \"usage\" : {\n \"total_tokens\" : 3 },\n  \"x\": [1, {\"usage\": 2}]\n}\n", 3},
		{"Responses API", `{"output":[],"usage":{"input_tokens":3,"output_tokens":4,"total_tokens":7}}`, 7},
		{"Anthropic", `{"content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":10,` +
			`"cache_creation_input_tokens":2,"cache_read_input_tokens":100,"output_tokens":5}}`, 17},
		{"no total", `{"usage":{"prompt_tokens":3,"completion_tokens":4}}`, 7},
		{"nested usage only", `{"data":{"usage":{"total_tokens":5}},"list":[{"usage":{"total_tokens":5}}]}`, -1},
		{"top-level array", `[{"usage":{"total_tokens":5}}]`, -1},
		{"usage null", `{"usage":null,"x":{"total_tokens":5}}`, -1},
		{"usage a string", `{"model":"usage","usage":"total_tokens"}`, -1},
		{"usage without tokens", `{"usage":{"requests":1}}`, -1},
		{"negative", `{"usage":{"total_tokens":-1}}`, -1},
		{"cut off", `{"id":"c","usage":{"total_tokens":5`, -1},
		{"no usage", `{"error":{"message":"x"}}`, -1},
		{"empty", ``, -1},
	} {
		t.Run(tc.name, func(t *testing.T) { checkMeter(t, "application/json", tc.body, tc.want) })
	}
	t.Run("usage too large", func(t *testing.T) {
		body := `{"usage":{"total_tokens":5,"x":"` + strings.Repeat("a", 5000) + `"}}`
		checkMeter(t, "application/json", body, -1)
	})
}

func TestMeterUsageSSE(t *testing.T) {
	const openAI = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"max_tokens\"}}],\"usage\":null}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":6,\"completion_tokens\":10,\"total_tokens\":16}}\n\n" +
		"data: [DONE]\n\n"
	const anthropic = "event: message_start\n" +
		"data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
		"event: ping\ndata: {\"type\": \"ping\"}\n\n" +
		"event: content_block_delta\n" +
		"data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n" +
		"event: message_delta\n" +
		"data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	for _, tc := range []struct {
		name, body string
		want       float64
	}{
		{"OpenAI", openAI, 16},
		{"OpenAI, CRLF", strings.ReplaceAll(openAI, "\n", "\r\n"), 16},
		{"OpenAI, no usage asked", "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n", -1},
		{"Anthropic", anthropic, 25 + 15},
		{"Anthropic, cut after message_start", anthropic[:strings.Index(anthropic, "event: message_delta")], -1},
		{"Anthropic, message_delta only", anthropic[strings.Index(anthropic, "event: message_delta"):], 15},
		{"Responses API", "event: response.completed\n" +
			"data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":5,\"total_tokens\":9}}}\n\n", 9},
		{"data on two lines, comments", ": keep-alive\n\ndata:{\"usage\":\ndata: {\"total_tokens\":4}}\nid: 7\n\n", 4},
		{"last event without blank line", "data: {\"usage\":{\"total_tokens\":4}}", 4},
		{"cut off", "data: {\"choices\":[]}\n\ndata: {\"usage\":{\"total_", -1},
		{"not data", "event: {\"usage\":{\"total_tokens\":4}}\n\n", -1},
		{"empty", "", -1},
	} {
		t.Run(tc.name, func(t *testing.T) { checkMeter(t, "text/event-stream", tc.body, tc.want) })
	}
	t.Run("line too long skipped", func(t *testing.T) {
		long := "data: {\"usage\":{\"total_tokens\":99},\"x\":\"" + strings.Repeat("a", 1<<20) + "\"}\n\n"
		body := long + "data: {\"usage\":{\"total_tokens\":4}}\n\n"
		for _, size := range []int{len(body), 4096, 1000} {
			m := meterResponse(t, "text/event-stream")
			for b := body; b != ""; b = b[min(size, len(b)):] {
				m.Write([]byte(b[:min(size, len(b))]))
			}
			c, ok := readToEnd(m)
			assert.True(t, ok)
			assert.Equal(t, bucket.Cost{bucket.Tokens: 4}, c, "writes of %d", size)
		}
	})
}

// TestMeterUsageStreamUnfinished: a stream's usage counts once the
// stream has ended, by its last event (OpenAI's [DONE], Anthropic's
// message_stop, the Responses API's response.completed) or read to its
// end; one closed before, which reported a usage as it went (cumulative
// counts in every chunk, or a message_delta before the last), reports
// nothing, and its charge stands. Before, it reported the usage seen so
// far: 11 and 12 tokens of calls whose providers count more.
func TestMeterUsageStreamUnfinished(t *testing.T) {
	const (
		openAIChunk = "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]," +
			"\"usage\":{\"prompt_tokens\":6,\"completion_tokens\":5,\"total_tokens\":11}}\n\n"
		openAILast = "data: {\"object\":\"chat.completion.chunk\",\"choices\":[]," +
			"\"usage\":{\"prompt_tokens\":6,\"completion_tokens\":200,\"total_tokens\":206}}\n\n"
		anthropicStart = "event: message_start\n" +
			"data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":6,\"output_tokens\":1}}}\n\n"
		anthropicDelta = "event: message_delta\n" +
			"data: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":6}}\n\n"
		anthropicLast = "event: message_delta\n" +
			"data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":200}}\n\n"
		anthropicStop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
		stopInText    = "event: content_block_delta\n" +
			"data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"message_stop\"}}\n\n"
	)
	for _, tc := range []struct {
		name, body string
		end        bool // read to the end (io.EOF)
		want       float64
	}{
		{"OpenAI, closed early", openAIChunk + openAIChunk, false, -1},
		{"OpenAI, to its [DONE]", openAIChunk + openAILast + "data: [DONE]\n\n", false, 206},
		{"OpenAI, to its end", openAIChunk + openAILast, true, 206},
		{"Anthropic, closed early", anthropicStart + anthropicDelta, false, -1},
		{"Anthropic, a text of message_stop", anthropicStart + anthropicDelta + stopInText, false, -1},
		{"Anthropic, to its message_stop", anthropicStart + anthropicDelta + anthropicLast + anthropicStop, false, 206},
		{"Anthropic, to its end", anthropicStart + anthropicDelta + anthropicLast, true, 206},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := meterResponse(t, "text/event-stream")
			_, err := m.Write([]byte(tc.body))
			require.NoError(t, err)
			var (
				c  bucket.Cost
				ok bool
			)
			if tc.end {
				c, ok = readToEnd(m)
			} else {
				c, ok = m.Cost()
			}
			if tc.want < 0 {
				assert.False(t, ok, "found %v", c)
				return
			}
			require.True(t, ok)
			assert.Equal(t, tc.want, c[bucket.Tokens])
		})
	}
}

func TestMeterUsageResponses(t *testing.T) {
	for _, tc := range []struct {
		status      int
		contentType string
		encoding    string
		metered     bool
	}{
		{200, "application/json", "", true},
		{201, "application/json; charset=utf-8", "", true},
		{200, "application/vnd.api+json", "", true},
		{200, "Text/Event-Stream; charset=utf-8", "", true},
		{200, "text/plain", "", false},
		{200, "", "", false},
		{200, "application/json", "gzip", false},
		{429, "application/json", "", false},
		{500, "text/event-stream", "", false},
		{304, "application/json", "", false},
	} {
		h := http.Header{"Content-Type": {tc.contentType}}
		if tc.encoding != "" {
			h.Set("Content-Encoding", tc.encoding)
		}
		m := llmclient.MeterUsage(&http.Response{StatusCode: tc.status, Header: h})
		assert.Equal(t, tc.metered, m != nil, "%d %q %q", tc.status, tc.contentType, tc.encoding)
	}
}

// TestMeterUsageInputOutput: a usage with input and output tokens
// (Anthropic's, the Responses API's) reports each as a dimension of its own,
// input counting cache writes but not cache reads, so that a bucket limited
// as Anthropic limits is reconciled per dimension; one without reports
// tokens alone.
func TestMeterUsageInputOutput(t *testing.T) {
	for _, tc := range []struct {
		name, contentType, body string
		want                    bucket.Cost
	}{
		{"Anthropic JSON", "application/json", `{"usage":{"input_tokens":10,"cache_creation_input_tokens":2,` +
			`"cache_read_input_tokens":100,"output_tokens":5}}`,
			bucket.Cost{bucket.Tokens: 17, bucket.InputTokens: 12, bucket.OutputTokens: 5}},
		{"Anthropic stream", "text/event-stream",
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
			bucket.Cost{bucket.Tokens: 40, bucket.InputTokens: 25, bucket.OutputTokens: 15}},
		{"OpenAI", "application/json", `{"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`,
			bucket.Cost{bucket.Tokens: 12}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := meterResponse(t, tc.contentType)
			_, err := m.Write([]byte(tc.body))
			require.NoError(t, err)
			c, ok := readToEnd(m)
			require.True(t, ok)
			assert.Equal(t, tc.want, c)
		})
	}
}

// TestStreamWithoutUsageWarns: an OpenAI stream that ends without a usage,
// its charge left unreconciled, is logged at warn level, once a minute at
// most; one that reports its usage, or is cut off, is not.
func TestStreamWithoutUsageWarns(t *testing.T) {
	var logs strings.Builder
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	llmclient.ResetNoUsageWarning()
	const chunk = "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"
	feed := func(body string) {
		m := meterResponse(t, "text/event-stream")
		_, err := m.Write([]byte(body))
		require.NoError(t, err)
		m.Cost()
	}
	feed(chunk + "data: {\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"total_tokens\":4}}\n\ndata: [DONE]\n\n")
	feed(chunk) // cut off: it may have been the caller's doing
	assert.Empty(t, logs.String())
	feed(chunk + "data: [DONE]\n\n")
	assert.Contains(t, logs.String(), "level=WARN")
	assert.Contains(t, logs.String(), "stream_options.include_usage")
	n := len(logs.String())
	feed(chunk + "data: [DONE]\n\n")
	assert.Len(t, logs.String(), n, "once a minute at most")
}

// TestMeterOpenAIUsage: a call with a cap is reckoned at its prompt and
// its cap, or its usage if more; one without, at its usage.
func TestMeterOpenAIUsage(t *testing.T) {
	meter := func(reqBody, ctype, body string) float64 {
		req, err := http.NewRequest("POST", "https://h/v1/chat/completions", strings.NewReader(reqBody))
		require.NoError(t, err)
		m := llmclient.MeterOpenAIUsage(&http.Response{StatusCode: 200, Request: req, Header: http.Header{"Content-Type": {ctype}}})
		require.NotNil(t, m)
		_, err = m.Write([]byte(body))
		require.NoError(t, err)
		c, ok := m.Cost()
		require.True(t, ok)
		return c[bucket.Tokens]
	}
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	usage := `{"usage":{"prompt_tokens":6,"completion_tokens":10,"total_tokens":16}}`
	assert.Equal(t, 106.0, meter(`{`+msgs+`,"max_tokens":100}`, "application/json", usage))
	assert.Equal(t, 56.0, meter(`{`+msgs+`,"max_tokens":100,"max_completion_tokens":50}`, "application/json", usage))
	assert.Equal(t, 16.0, meter(`{`+msgs+`,"max_tokens":5}`, "application/json", usage), "the usage, above the cap")
	assert.Equal(t, 16.0, meter(`{`+msgs+`}`, "application/json", usage), "no cap: the usage")
	assert.Equal(t, 6.0+100, meter(largeRequest("gpt-4.1"), "application/json", usage), "the cap after 9 MiB of messages")
	assert.Equal(t, 106.0, meter(`{`+msgs+`,"max_tokens":100,"stream":true}`, "text/event-stream",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":6,\"completion_tokens\":10,\"total_tokens\":16}}\n\ndata: [DONE]\n\n"))
}
