package tiktoken

import (
	"math"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
)

// What OpenAI's cookbook counts for the chat format ("How to count tokens
// with tiktoken", checked there against the prompt_tokens the API reports):
// 3 tokens around each message, 1 more for a name, 3 that prime the reply.
const (
	tokensPerMessage = 3
	tokensPerName    = 1
	replyPriming     = 3
)

// Estimator returns an llmclient.Estimator that counts a request's prompt
// with the tokenizer of model's encoding, or of each request's own model if
// model is "", and adds the completion as llmclient.Estimate reserves it
// (MaxCompletionTokens, else MaxTokens, else 1,024). Give the model when the
// request names something else: an Azure deployment, or a model behind a
// gateway under a name of its own.
//
// The prompt is counted as OpenAI's cookbook counts a chat: 3 tokens per
// message, the tokens of its role and of its content, and 3 for the reply.
// An llmclient.ChatRequest holds no names, images or tools; RequestCost
// reads them from the body.
//
// The estimator is safe for concurrent use. The first use of an encoding
// loads its vocabulary, compiled into the binary: about 20 ms, and no file
// or network access.
func Estimator(model string) llmclient.Estimator {
	var fixed *encoding
	if model != "" {
		fixed = encodingFor(model)
	}
	return func(req llmclient.ChatRequest) int {
		enc := fixed
		if enc == nil {
			enc = encodingFor(req.Model)
		}
		k := newCounter(enc)
		fixedTokens := replyPriming
		for _, m := range req.Messages {
			fixedTokens += tokensPerMessage
			k.add(m.Role)
			k.add(m.Content)
		}
		return total(k.total(), fixedTokens, completion(req.MaxTokens, req.MaxCompletionTokens))
	}
}

// Estimate is Estimator(""): each request counted with its own model's
// encoding. It is an llmclient.Estimator, for llmclient.WithEstimator and
// llmclient.RequestCost.
func Estimate(req llmclient.ChatRequest) int {
	return estimate(req)
}

var estimate = Estimator("")

// RequestCost returns a cost function for transport.WithCost that charges
// an OpenAI chat completion request {requests: 1, tokens: prompt +
// completion}, as llmclient.RequestCost does, with the prompt counted by the
// tokenizer of model's encoding (or of the request's model, if model is
// ""). It reads what llmclient.RequestCost does not: the messages' names,
// the text of every text part, images, tool calls, and the tool (or
// function) definitions.
//
// An image counts as OpenAI's documented formula counts it for GPT-4o and
// GPT-4.1: 85 tokens at detail "low", else 85 plus 170 a 512-pixel tile,
// its size read from a PNG, JPEG or GIF data URL, and counted at the most
// (1,445, a 768 x 2048 image) when it cannot be read (a URL). The tool
// definitions count as the cookbook counts them (their names, descriptions,
// properties and enums, with its overheads), nested properties the same
// way. A tool call counts the tokens of its function's name and arguments.
// Audio, files and response_format schemas are not counted; the usage the
// response reports reconciles them.
//
// It reads the request from a copy of its body (GetBody), never from Body,
// and tokenizes at most 256 KiB of a request's text, counting the rest at
// the rate of the first 256 KiB. A request it cannot read (no GetBody, not JSON, no
// messages) is charged {requests: 1}, as by llmclient.RequestCost.
func RequestCost(model string) func(*http.Request) bucket.Cost {
	var fixed *encoding
	if model != "" {
		fixed = encodingFor(model)
	}
	return func(r *http.Request) bucket.Cost {
		req, ok := readRequest(r)
		if !ok {
			return bucket.Cost{bucket.Requests: 1}
		}
		enc := fixed
		if enc == nil {
			enc = encodingFor(req.Model)
		}
		return bucket.Cost{bucket.Requests: 1, bucket.Tokens: float64(req.tokens(enc))}
	}
}

// encodingFor returns the encoding of a chat model: cl100k_base for GPT-4
// (but not GPT-4o, GPT-4.1 or GPT-4.5) and GPT-3.5, o200k_base for every
// other (GPT-4o, GPT-4.1, GPT-5, o1, o3, o4, and a model it does not know).
// A provider's prefix ("openai/gpt-4") and a fine-tune's ("ft:gpt-4:…") are
// ignored.
func encodingFor(model string) *encoding {
	model = strings.ToLower(strings.TrimPrefix(model, "ft:"))
	if i := strings.LastIndexByte(model, '/'); i >= 0 {
		model = model[i+1:]
	}
	switch {
	case strings.HasPrefix(model, "gpt-3.5"), strings.HasPrefix(model, "gpt-35"):
		return cl100k
	case model == "gpt-4", strings.HasPrefix(model, "gpt-4-"):
		return cl100k
	}
	return o200k
}

// completion returns the completion tokens llmclient.Estimate reserves for
// a request with these bounds: asked of Estimate itself, for a request with
// no messages, so that the rule cannot drift.
func completion(maxTokens, maxCompletionTokens int) int {
	return llmclient.Estimate(llmclient.ChatRequest{MaxTokens: maxTokens, MaxCompletionTokens: maxCompletionTokens})
}

// total adds the parts of an estimate, at most math.MaxInt: a request's
// max_tokens is the caller's number, unbounded.
func total(parts ...int) int {
	sum := 0
	for _, p := range parts {
		p = max(p, 0)
		if p > math.MaxInt-sum {
			return math.MaxInt
		}
		sum += p
	}
	return sum
}
