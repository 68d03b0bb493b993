// Openai shows the official OpenAI Go client (github.com/openai/openai-go)
// throttled by sluice: every call waits on a bucket of requests and tokens
// per minute, is charged an estimate of its tokens before it is sent, and
// has that charge reconciled with the usage the response reports, as
// OpenAI counts a call: its prompt and its max_tokens.
//
// It makes one completion and one streamed completion, and prints for each
// the reply, the usage, and what the bucket was charged and reconciled:
//
//	sluice + openai-go against http://127.0.0.1:39731/v1 (in-process fake API)
//	completion: Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do
//	  usage: 10 prompt + 16 completion = 26 tokens
//	  bucket: charged 1 request and 75 tokens, reconciled -1 tokens: 74 tokens spent
//	stream: Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do
//	  usage: 10 prompt + 16 completion = 26 tokens
//	  bucket: charged 1 request and 75 tokens, reconciled -1 tokens: 74 tokens spent
//
// The charge is an estimate made from the request (llmclient.RequestCost):
// the prompt's characters / 4, 4 tokens per message, and -max-tokens. The
// reconciliation brings the prompt's part to the prompt tokens the API
// reported (llmclient.MeterOpenAIUsage): OpenAI counts the max_tokens
// against the limit whatever the completion uses, and so does the fake.
//
// With no -base-url it serves a fake OpenAI-compatible API in-process
// (llmtest), so it needs no setup and no API key. With -base-url
// https://api.openai.com/v1 it calls OpenAI with the key in -api-key, which
// defaults to $OPENAI_API_KEY.
//
// Usage:
//
//	go run ./examples/openai [flags]
//
// Flags:
//
//	-base-url    the API's base URL; empty serves a fake API in-process (default "")
//	-api-key     the API key; empty means $OPENAI_API_KEY
//	-model       the model (default "gpt-5-mini")
//	-prompt      the user message (default "Say hello in a few words.")
//	-max-tokens  the most the completion may take (default 64)
//	-rpm, -tpm   the requests and tokens per minute sluice keeps to (default 500, 30000)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		os.Exit(2) // the flag package has printed the problem and the usage
	default:
		fmt.Fprintln(os.Stderr, "openai:", err)
		os.Exit(1)
	}
}

// config is what the command line asks for.
type config struct {
	baseURL, apiKey, model, prompt string
	maxTokens                      int64
	rpm, tpm                       float64
}

// errUsage reports command-line errors, already printed with the usage.
var errUsage = errors.New("usage error")

// parseFlags parses and checks args. Problems are written to stderr with the
// usage and reported as errUsage (or flag.ErrHelp for -h).
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("openai", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: openai [flags]\n\n"+
			"Calls an OpenAI-compatible API with openai-go through sluice, and prints\n"+
			"the usage of each call and how the bucket reconciled its charge.\n\nFlags:")
		fs.PrintDefaults()
	}
	fs.StringVar(&c.baseURL, "base-url", "", "the API's base `URL`; empty serves a fake API in-process")
	fs.StringVar(&c.apiKey, "api-key", "", "the API key; empty means $OPENAI_API_KEY")
	fs.StringVar(&c.model, "model", "gpt-5-mini", "the model")
	fs.StringVar(&c.prompt, "prompt", "Say hello in a few words.", "the user message")
	fs.Int64Var(&c.maxTokens, "max-tokens", 64, "the most tokens the completion may take")
	fs.Float64Var(&c.rpm, "rpm", 500, "requests per minute")
	fs.Float64Var(&c.tpm, "tpm", 30_000, "tokens per minute")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, errUsage
	}
	var problem string
	switch {
	case fs.NArg() > 0:
		problem = fmt.Sprintf("unexpected argument %q", fs.Arg(0))
	case c.maxTokens < 1:
		problem = fmt.Sprintf("-max-tokens must be >= 1, got %d", c.maxTokens)
	case !(c.rpm > 0) || math.IsInf(c.rpm, 0):
		problem = fmt.Sprintf("-rpm must be a number > 0, got %g", c.rpm)
	case !(c.tpm > 0) || math.IsInf(c.tpm, 0):
		problem = fmt.Sprintf("-tpm must be a number > 0, got %g", c.tpm)
	}
	if problem != "" {
		fmt.Fprintln(stderr, "openai:", problem)
		fs.Usage()
		return c, errUsage
	}
	if c.apiKey == "" {
		c.apiKey = os.Getenv("OPENAI_API_KEY")
	}
	return c, nil
}

// callTimeout bounds each call, its waits on the bucket included.
const callTimeout = time.Minute

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	where := c.baseURL
	if c.baseURL == "" {
		api := llmtest.NewServer(llmtest.Config{ChargeCap: true})
		defer api.Close()
		c.baseURL, where = api.URL, api.URL+" (in-process fake API)"
		if c.apiKey == "" {
			c.apiKey = "sk-fake"
		}
	}

	// The bucket every call waits on; a bucket.NewRedis would share it with
	// every process of a fleet.
	b := &ledger{Bucket: bucket.NewLocal(bucket.PerMinute(c.rpm),
		bucket.WithLimit(bucket.Tokens, bucket.PerMinute(c.tpm)))}
	// The preset: keyed by model and hashed API key, charged {requests: 1,
	// tokens: estimate}, reconciled with the usage.
	httpClient := transport.NewClient(llmclient.OpenAI(b))
	client := openai.NewClient(
		option.WithBaseURL(c.baseURL),
		option.WithAPIKey(c.apiKey),
		option.WithHTTPClient(httpClient),
		option.WithMaxRetries(0), // sluice retries, through the bucket
	)
	params := openai.ChatCompletionNewParams{
		Model:               c.model,
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage(c.prompt)},
		MaxCompletionTokens: openai.Int(c.maxTokens),
	}
	fmt.Fprintf(stdout, "sluice + openai-go against %s\n", where)

	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	res, err := client.Chat.Completions.New(cctx, params)
	if err != nil {
		return fmt.Errorf("completion: %w", err)
	}
	reply := ""
	if len(res.Choices) > 0 {
		reply = res.Choices[0].Message.Content
	}
	report(stdout, "completion", reply, res.Usage, b)

	// A stream reports its usage only if asked to.
	params.StreamOptions.IncludeUsage = openai.Bool(true)
	stream := client.Chat.Completions.NewStreaming(cctx, params)
	var text strings.Builder
	var usage openai.CompletionUsage
	for stream.Next() {
		chunk := stream.Current()
		if len(chunk.Choices) > 0 {
			text.WriteString(chunk.Choices[0].Delta.Content)
		}
		if chunk.Usage.TotalTokens > 0 {
			usage = chunk.Usage
		}
	}
	if err := stream.Err(); err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	if err := stream.Close(); err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	report(stdout, "stream", text.String(), usage, b)
	return nil
}

// report prints a call's reply and usage, and what b charged and
// reconciled for it.
func report(w io.Writer, name, reply string, u openai.CompletionUsage, b *ledger) {
	charged, adjusted := b.take()
	fmt.Fprintf(w, "%s: %s\n", name, strings.Join(strings.Fields(reply), " "))
	fmt.Fprintf(w, "  usage: %d prompt + %d completion = %d tokens\n", u.PromptTokens, u.CompletionTokens, u.TotalTokens)
	fmt.Fprintf(w, "  bucket: charged %g request and %g tokens, reconciled %+g tokens: %g tokens spent\n",
		charged[bucket.Requests], charged[bucket.Tokens], adjusted[bucket.Tokens],
		charged[bucket.Tokens]+adjusted[bucket.Tokens])
}

// ledger is a bucket that adds up what it is charged (Reserve) and adjusted
// (Adjust and Settle: reconciliations and refunds) until take.
type ledger struct {
	bucket.Bucket
	mu                sync.Mutex
	charged, adjusted bucket.Cost
}

func (l *ledger) Reserve(ctx context.Context, key string, cost bucket.Cost, maxWait time.Duration) (bucket.Reservation, error) {
	r, err := l.Bucket.Reserve(ctx, key, cost, maxWait)
	if err == nil && r.OK {
		l.add(&l.charged, cost)
	}
	return r, err
}

func (l *ledger) Adjust(ctx context.Context, key string, delta bucket.Cost) error {
	err := l.Bucket.Adjust(ctx, key, delta)
	if err == nil {
		l.add(&l.adjusted, delta)
	}
	return err
}

// Settle passes a served call's refund or debit on as one (bucket.Settle).
func (l *ledger) Settle(ctx context.Context, key string, delta bucket.Cost) error {
	err := bucket.Settle(ctx, l.Bucket, key, delta)
	if err == nil {
		l.add(&l.adjusted, delta)
	}
	return err
}

func (l *ledger) add(sum *bucket.Cost, c bucket.Cost) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if *sum == nil {
		*sum = bucket.Cost{}
	}
	for dim, v := range c {
		(*sum)[dim] += v
	}
}

// take returns what was charged and adjusted since the last take.
func (l *ledger) take() (charged, adjusted bucket.Cost) {
	l.mu.Lock()
	defer l.mu.Unlock()
	charged, adjusted = l.charged, l.adjusted
	l.charged, l.adjusted = nil, nil
	return charged, adjusted
}
