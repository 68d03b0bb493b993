package llmclient_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/llmfixture"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
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

// TestStreamClosedEarlyKeepsTheCharge: an OpenAI and an Anthropic stream
// of 200 tokens that the caller closes after 50 deltas keep their charge in
// the bucket (the estimate, and max_tokens), whether the stream reported
// its usage only at its end (llmtest's fake, as the providers do) or as it
// went (cumulative counts with every delta, as some servers send); read to
// the end, each is reconciled with its final usage. Before, a stream that
// reported its usage as it went was reconciled, once closed, to what it had
// reported so far: 56 tokens of OpenAI's 1,007 charged, 50 output tokens of
// Anthropic's 1,000, while the provider counts what it generated.
func TestStreamClosedEarlyKeepsTheCharge(t *testing.T) {
	const (
		tokens    = 200
		readFirst = 50 // deltas
		request   = `{"model":"m","messages":[{"role":"user","content":"Say hello"}],"max_tokens":1000,"stream":true,` +
			`"stream_options":{"include_usage":true}}`
		// What the requests are charged: ⌈9/4⌉ + 4 a message, + max_tokens;
		// what the servers report: ⌈9/4⌉ + 3, and the 200 tokens.
		chargedIn, chargedOut = 7, 1000
		usedIn, usedOut       = 6, tokens
	)
	fake := llmtest.NewServer(llmtest.Config{ReplyTokens: tokens})
	t.Cleanup(fake.Close)
	for _, api := range []string{"openai", "anthropic"} {
		for _, shape := range []string{"usage at the end", "usage as it goes"} {
			for _, early := range []bool{true, false} {
				name := api + ", " + shape + ", read to the end"
				if early {
					name = api + ", " + shape + ", closed early"
				}
				t.Run(name, func(t *testing.T) {
					url := fake.URL + "/chat/completions"
					if api == "anthropic" {
						url = fake.AnthropicURL + "/v1/messages"
					}
					if shape == "usage as it goes" {
						url = newRecorder(t, cumulativeStream(api, tokens, usedIn, early, readFirst)).URL
					}
					b := bucket.NewLocal(bucket.PerMinute(testRPM), bucket.WithLimit(bucket.Tokens, bucket.PerMinute(testTPM)),
						bucket.WithLimit(bucket.InputTokens, bucket.PerMinute(testTPM)),
						bucket.WithLimit(bucket.OutputTokens, bucket.PerMinute(testTPM)), bucket.WithClock(llmfixture.Frozen{}))
					tr := newTransport(b)
					if api == "anthropic" {
						tr = transport.New(nil, llmclient.Anthropic(b), transport.WithKey(func(*http.Request) string { return key }))
					}
					resp, err := (&http.Client{Transport: tr}).Post(url, "application/json", strings.NewReader(request))
					require.NoError(t, err)
					require.Equal(t, 200, resp.StatusCode)
					if early {
						readDeltas(t, resp.Body, readFirst)
					} else {
						_, err = io.Copy(io.Discard, resp.Body)
						require.NoError(t, err)
					}
					require.NoError(t, resp.Body.Close())
					left := b.Tokens(key)
					spent := func(dim string) float64 { return testTPM - left[dim] }
					switch {
					case api == "openai" && early:
						assert.Equal(t, float64(chargedIn+chargedOut), spent(bucket.Tokens), "the charge stands")
					case api == "openai":
						assert.Equal(t, float64(usedIn+usedOut), spent(bucket.Tokens), "reconciled")
					case early:
						assert.Equal(t, float64(chargedIn), spent(bucket.InputTokens), "the charge stands")
						assert.Equal(t, float64(chargedOut), spent(bucket.OutputTokens), "the charge stands")
					default:
						assert.Equal(t, float64(usedIn), spent(bucket.InputTokens), "reconciled")
						assert.Equal(t, float64(usedOut), spent(bucket.OutputTokens), "reconciled")
					}
				})
			}
		}
	}
}

// cumulativeStream answers as an OpenAI (api "openai") or Anthropic stream
// of n deltas that reports its usage, cumulative, with every delta, the
// input as in; if stall, it stops after first deltas until the client
// leaves.
func cumulativeStream(api string, n, in int, stall bool, first int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		if api == "anthropic" {
			fmt.Fprintf(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":%d,\"output_tokens\":1}}}\n\n", in)
		}
		for i := 1; i <= n; i++ {
			if api == "openai" {
				fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\"tok \"}}],"+
					"\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", in, i, in+i)
			} else {
				fmt.Fprintf(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"tok \"}}\n\n"+
					"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":%d}}\n\n", i)
			}
			if stall && i == first {
				w.(http.Flusher).Flush()
				<-r.Context().Done()
				return
			}
		}
		if api == "openai" {
			io.WriteString(w, "data: [DONE]\n\n")
		} else {
			io.WriteString(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
		}
	}
}

// readDeltas reads body until it has seen n deltas of an OpenAI or
// Anthropic stream.
func readDeltas(t *testing.T, body io.Reader, n int) {
	t.Helper()
	r := bufio.NewReader(body)
	for seen := 0; seen < n; {
		line, err := r.ReadString('\n')
		require.NoError(t, err, "after %d deltas", seen)
		if strings.HasPrefix(line, "data:") && (strings.Contains(line, `"content"`) || strings.Contains(line, `"text_delta"`)) {
			seen++
		}
	}
}
