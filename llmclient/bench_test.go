package llmclient_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/transport"
)

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// benchBodies are a chat completion of about 200 tokens, as JSON and as a
// stream of one chunk per token with the usage last.
func benchBodies() (jsonBody, sseBody string) {
	words := strings.Fields(strings.Repeat("lorem ipsum dolor sit amet ", 40))
	jsonBody = fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-test",`+
		`"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":20,"completion_tokens":200,"total_tokens":220}}`, strings.Join(words, " "))
	var sse strings.Builder
	for _, w := range words {
		fmt.Fprintf(&sse, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-test",`+
			`"choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}],"usage":null}`+"\n\n", " "+w)
	}
	sse.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-test",` +
		`"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":200,"total_tokens":220}}` + "\n\ndata: [DONE]\n\n")
	return jsonBody, sse.String()
}

// fixedMeter is a UsageMeter that reads nothing and reports 220 tokens:
// the cost of the body wrapper and the reconciliation alone.
type fixedMeter struct{}

func (fixedMeter) Write(p []byte) (int, error) { return len(p), nil }
func (fixedMeter) Cost() (bucket.Cost, bool)   { return bucket.Cost{bucket.Tokens: 220}, true }

// BenchmarkMeteredBody measures what reconciliation adds to a response:
// a round trip through a Transport over an in-memory base (no network),
// whose body is then read to its end in reads of readSize bytes, without
// WithUsage ("bare"), with a meter that reads nothing ("wrapper") and with
// MeterUsage ("metered").
func BenchmarkMeteredBody(b *testing.B) {
	jsonBody, sseBody := benchBodies()
	const readSize = 1024 // a network read is rarely larger
	for _, body := range []struct{ name, contentType, body string }{
		{"json", "application/json", jsonBody},
		{"sse", "text/event-stream", sseBody},
	} {
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {body.contentType}},
				Body: io.NopCloser(strings.NewReader(body.body)), Request: r}, nil
		})
		for _, usage := range []struct {
			name string
			f    func(*http.Response) transport.UsageMeter
		}{
			{"bare", nil},
			{"wrapper", func(*http.Response) transport.UsageMeter { return fixedMeter{} }},
			{"metered", llmclient.MeterUsage},
		} {
			name := body.name + "/" + usage.name
			opts := []transport.Option{
				transport.WithBucket(bucket.NewLocal(bucket.Limit{Rate: 1e9, Burst: 1e9},
					bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 1e9, Burst: 1e9}))),
				transport.WithCost(func(*http.Request) bucket.Cost {
					return bucket.Cost{bucket.Requests: 1, bucket.Tokens: 1000}
				}),
				transport.WithUsage(usage.f),
			}
			tr := transport.New(base, opts...)
			req, _ := http.NewRequest("POST", "http://api.example/v1/chat/completions", nil)
			b.Run(name, func(b *testing.B) {
				buf := make([]byte, readSize)
				b.SetBytes(int64(len(body.body)))
				b.ReportAllocs()
				for b.Loop() {
					resp, err := tr.RoundTrip(req)
					if err != nil {
						b.Fatal(err)
					}
					n, _ := io.CopyBuffer(io.Discard, struct{ io.Reader }{resp.Body}, buf)
					resp.Body.Close()
					if n != int64(len(body.body)) {
						b.Fatalf("read %d bytes of %d", n, len(body.body))
					}
				}
			})
		}
	}
}
