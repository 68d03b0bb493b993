package llmclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/peek"
	"github.com/sluicehq/sluice/transport"
)

// Client calls an OpenAI-compatible chat completions API through a
// transport.Transport: every call first takes {requests: 1, tokens: the
// estimate} from the bucket, in one reservation, and gives back (or takes
// more of) the tokens once the response reports what it used. Failed calls
// are retried as transport.Retry describes.
//
// Client is safe for concurrent use.
type Client struct {
	url       string // of the chat completions endpoint
	apiKey    string
	http      *http.Client
	maxRead   int64 // WithMaxResponseBytes
	estimated bool  // by Estimate: no WithEstimator
}

// New returns a Client of the API at baseURL, such as
// "https://api.openai.com/v1" (the chat completions endpoint is
// baseURL + "/chat/completions"), that authenticates with apiKey as a
// bearer token; an empty apiKey sends none.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := newConfig(opts)
	hc := *c.http
	hc.Transport = transport.New(hc.Transport, append([]transport.Option{
		OpenAI(c.bucket),
		transport.WithKey(c.key),
		transport.WithCost(RequestCost(c.estimator)),
	}, c.transport...)...)
	return &Client{url: strings.TrimSuffix(baseURL, "/") + "/chat/completions", apiKey: apiKey, http: &hc,
		maxRead: c.maxRead, estimated: c.estimator == nil}
}

// explainEstimate says what Estimate charged the request body is and what
// to set.
func explainEstimate(body any) string {
	req, ok := body.(ChatRequest)
	if sr, isStream := body.(streamRequest); isStream {
		req, ok = sr.ChatRequest, true
	}
	if !ok {
		return "the call's estimate is larger than the tokens burst"
	}
	completion, from := req.MaxCompletionTokens, "MaxCompletionTokens"
	if completion <= 0 {
		completion, from = req.MaxTokens, "MaxTokens"
	}
	if completion <= 0 {
		completion, from = defaultCompletion, "MaxTokens unset, so 1,024 were assumed"
	}
	total := Estimate(req)
	return fmt.Sprintf("the call's estimate, %d tokens, is %d for the prompt (its characters / 4, and 4 a message) "+
		"and %d for the completion (%s): set MaxTokens lower, or the tokens limit's burst higher",
		total, total-completion, completion, from)
}

// Chat sends req and returns the completion. An error the provider answers
// with is an *APIError; a completion larger than WithMaxResponseBytes
// allows is a *TooLargeError.
func (c *Client) Chat(ctx context.Context, req ChatRequest) (*Response, error) {
	resp, err := c.post(ctx, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, c.maxRead+1))
	if err != nil {
		return nil, fmt.Errorf("llmclient: reading the response: %w", err)
	}
	if int64(len(body)) > c.maxRead {
		return nil, &TooLargeError{Limit: c.maxRead}
	}
	var r Response
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("llmclient: decoding the response: %w", err)
	}
	return &r, nil
}

// streamRequest is a ChatRequest for a stream that ends with the usage.
type streamRequest struct {
	ChatRequest
	Stream        bool `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// ChatStream returns the completion of req as it is generated, one chunk
// at a time; the last chunk carries the usage (it asks for it with
// stream_options.include_usage). Each iteration makes the call; leaving the
// loop early ends it, and its charge stands unless the usage had already
// arrived. An error ends the iteration: the call's (an *APIError if the
// provider answered with one), or the stream's, such as io.ErrUnexpectedEOF
// if it ended before its "[DONE]", or a *TooLargeError for an event larger
// than WithMaxResponseBytes allows.
//
//	for chunk, err := range client.ChatStream(ctx, req) {
//		if err != nil {
//			return err
//		}
//		for _, ch := range chunk.Choices {
//			fmt.Print(ch.Delta.Content)
//		}
//	}
func (c *Client) ChatStream(ctx context.Context, req ChatRequest) iter.Seq2[Chunk, error] {
	return func(yield func(Chunk, error) bool) {
		sr := streamRequest{ChatRequest: req, Stream: true}
		sr.StreamOptions.IncludeUsage = true
		resp, err := c.post(ctx, sr)
		if err != nil {
			yield(Chunk{}, err)
			return
		}
		defer resp.Body.Close()
		var (
			finished bool  // its "[DONE]" came
			left     bool  // the caller left the loop
			fail     error // what ended it otherwise
		)
		dec := sseDecoder{limit: c.maxRead, event: func(data []byte, tooLarge bool) bool {
			switch {
			case tooLarge:
				fail = fmt.Errorf("llmclient: reading the stream: %w", &TooLargeError{Limit: c.maxRead})
				return false
			case bytes.Equal(data, done):
				finished = true
				return false
			}
			var ch struct {
				Chunk
				errorBody
			}
			if err := json.Unmarshal(data, &ch); err != nil {
				fail = fmt.Errorf("llmclient: decoding a chunk: %w", err)
				return false
			}
			if ch.Error != nil {
				fail = newAPIError(resp.StatusCode, resp.Header, data, c.apiKey)
				return false
			}
			left = !yield(ch.Chunk, nil)
			return !left
		}}
		buf := make([]byte, streamRead)
		for !dec.stopped && fail == nil {
			n, err := resp.Body.Read(buf)
			dec.Write(buf[:n])
			switch {
			case dec.stopped:
			case err == io.EOF:
				fail = fmt.Errorf("llmclient: reading the stream: %w", io.ErrUnexpectedEOF)
			case err != nil:
				fail = fmt.Errorf("llmclient: reading the stream: %w", err)
			}
		}
		switch {
		case fail != nil:
			yield(Chunk{}, fail)
		case finished:
			// Read on to the end, so that the connection can be reused.
			peek.Drain(resp.Body)
		}
	}
}

// done is the data of the event that ends an OpenAI stream.
var done = []byte("[DONE]")

// streamRead is how much of a stream is read at a time.
const streamRead = 4 << 10

// post sends body as JSON to the chat completions endpoint and returns the
// response if it is a success.
func (c *Client) post(ctx context.Context, body any) (*http.Response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("llmclient: encoding the request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("llmclient: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ce := (*bucket.CostError)(nil); errors.As(err, &ce) && (ce.Dim == bucket.Tokens || strings.HasPrefix(ce.Dim, bucket.Tokens+"/")) && c.estimated {
			return nil, fmt.Errorf("llmclient: %s: %w", explainEstimate(body), err)
		}
		return nil, fmt.Errorf("llmclient: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return nil, newAPIError(resp.StatusCode, resp.Header, body, c.apiKey)
	}
	return resp, nil
}
