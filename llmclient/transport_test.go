package llmclient_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
)

func TestTransportBodyUnchanged(t *testing.T) {
	jsonBody := `{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"there\" é\\n"}}],` +
		`"usage":{"prompt_tokens":6,"completion_tokens":4,"total_tokens":10}}` + "\n"
	sseEvents := []string{
		": hello\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\r\n\r\n",
		"data: {\"choices\":[],\"usage\":{\"total_tokens\":10}}\n",
		"\n",
		"data: [DONE]\n\n",
	}
	for _, tc := range []struct {
		name, contentType string
		pieces            []string // written and flushed one by one
	}{
		{"JSON", "application/json", []string{jsonBody}},
		{"JSON in pieces", "application/json", []string{jsonBody[:7], jsonBody[7:100], jsonBody[100:]}},
		{"SSE", "text/event-stream", sseEvents},
	} {
		for _, oneByte := range []bool{false, true} {
			name := tc.name
			if oneByte {
				name += ", read byte by byte"
			}
			t.Run(name, func(t *testing.T) {
				srv := newRecorder(t, func(w http.ResponseWriter, _ *http.Request) {
					w.Header().Set("Content-Type", tc.contentType)
					for _, p := range tc.pieces {
						io.WriteString(w, p)
						w.(http.Flusher).Flush()
					}
				})
				b := newBucket()
				client := &http.Client{Transport: newTransport(b)}
				resp, err := client.Post(srv.URL, "application/json",
					strings.NewReader(`{"messages":[{"role":"user","content":"Say hello"}],"max_tokens":100}`))
				require.NoError(t, err)
				assert.Equal(t, bucket.Cost{bucket.Requests: 1, bucket.Tokens: helloEstimate}, spent(b))
				var r io.Reader = resp.Body
				if oneByte {
					r = iotest.OneByteReader(r)
				}
				got, err := io.ReadAll(r)
				require.NoError(t, err)
				require.NoError(t, resp.Body.Close())
				assert.Equal(t, strings.Join(tc.pieces, ""), string(got), "the bytes the server sent")
				assert.Equal(t, bucket.Cost{bucket.Requests: 1, bucket.Tokens: 10}, spent(b), "reconciled")
			})
		}
	}
}

// TestAnthropicStreamCutShortKeepsTheCharge: Anthropic's message_start
// reports the input and an output of a token or so, its message_delta the
// output in full. A stream that ended after message_start was reconciled
// down to that partial usage (26 of 225 tokens charged); the usage never
// showed in full, so the estimate stands.
func TestAnthropicStreamCutShortKeepsTheCharge(t *testing.T) {
	const (
		start = "event: message_start\n" +
			"data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
			"event: content_block_delta\n" +
			"data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"
		end = "event: message_delta\n" +
			"data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	)
	for _, tc := range []struct {
		name   string
		body   string
		stall  bool // after body, until the client goes
		tokens float64
	}{
		{"whole", start + end, false, 25 + 15},
		{"ends after message_start", start, false, helloEstimate},
		{"closed by the caller after message_start", start, true, helloEstimate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, tc.body)
				w.(http.Flusher).Flush()
				if tc.stall {
					<-r.Context().Done()
				}
			})
			b := newBucket()
			client := &http.Client{Transport: newTransport(b)}
			resp, err := client.Post(srv.URL, "application/json",
				strings.NewReader(`{"messages":[{"role":"user","content":"Say hello"}],"max_tokens":100}`))
			require.NoError(t, err)
			if tc.stall {
				got := make([]byte, len(tc.body))
				_, err = io.ReadFull(resp.Body, got)
			} else {
				_, err = io.ReadAll(resp.Body)
			}
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, bucket.Cost{bucket.Requests: 1, bucket.Tokens: tc.tokens}, spent(b))
		})
	}
}

// TestUsageFromALyingUpstream: a usage report is outside input. Through a
// Transport metered by MeterUsage, 1e15 or 1e300 tokens became a debit as
// large; an amount beyond any burst, negative or unreadable is no report,
// and a sum that overflows is none either: the estimate stands.
func TestUsageFromALyingUpstream(t *testing.T) {
	for _, tc := range []struct {
		name, contentType, body string
		tokens                  float64 // spent
	}{
		{"1e15", "application/json", `{"usage":{"total_tokens":1e15}}`, helloEstimate},
		{"1e300", "application/json", `{"usage":{"total_tokens":1e300}}`, helloEstimate},
		{"negative", "application/json", `{"usage":{"total_tokens":-5}}`, helloEstimate},
		{"beyond float64", "application/json", `{"usage":{"total_tokens":1e400}}`, helloEstimate},
		{"a sum that overflows", "application/json",
			`{"usage":{"prompt_tokens":1.5e308,"completion_tokens":1.5e308}}`, helloEstimate},
		{"stream: 1e300", "text/event-stream", "data: {\"choices\":[],\"usage\":{\"total_tokens\":1e300}}\n\n", helloEstimate},
		{"stream: negative output", "text/event-stream",
			"data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":-5}}\n\n", helloEstimate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newRecorder(t, reply(200, tc.body, "Content-Type", tc.contentType))
			b := newBucket()
			client := &http.Client{Transport: newTransport(b)}
			resp, err := client.Post(srv.URL, "application/json",
				strings.NewReader(`{"messages":[{"role":"user","content":"Say hello"}],"max_tokens":100}`))
			require.NoError(t, err)
			_, err = io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, bucket.Cost{bucket.Requests: 1, bucket.Tokens: tc.tokens}, spent(b))
		})
	}
}
