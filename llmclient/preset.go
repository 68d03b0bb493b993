package llmclient

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
)

// OpenAI is the preset for an OpenAI-compatible API: the Transport options
// that charge each call to b under ModelKey, {requests: 1, tokens: the
// prompt's estimate plus max_tokens} (RequestCost), and reconcile the
// estimate of the prompt with the usage the response reports, keeping the
// cap on the completion charged, as OpenAI counts it (MeterOpenAIUsage). b should limit
// bucket.Tokens as well as bucket.Requests, at one model's limits: each
// model gets a key, and so a bucket, of its own, as OpenAI limits each
// model apart. Options given after it override its own:
//
//	tr := transport.New(nil, llmclient.OpenAI(b), transport.WithMaxWait(time.Minute))
func OpenAI(b bucket.Bucket) transport.Option {
	return transport.Options(
		transport.WithBucket(b),
		transport.WithKey(ModelKey),
		transport.WithCost(RequestCost(nil)),
		transport.WithUsage(MeterOpenAIUsage),
	)
}

// Anthropic is the preset for Anthropic's Messages API: the Transport
// options that charge each call to b under ModelKey, {requests: 1,
// input_tokens: the estimate, output_tokens: max_tokens} (AnthropicCost),
// and reconcile both with the usage the response reports (MeterUsage). b
// should limit bucket.InputTokens and bucket.OutputTokens as well as
// bucket.Requests, at one model's limits, as Anthropic limits them; the
// anthropic-ratelimit-* headers then adjust each dimension.
func Anthropic(b bucket.Bucket) transport.Option {
	return transport.Options(
		transport.WithBucket(b),
		transport.WithKey(ModelKey),
		transport.WithCost(AnthropicCost()),
		transport.WithUsage(MeterUsage),
	)
}

// KeyModel returns the model a ModelKey names, "" if none: what follows
// the first "/" after the scheme's "://". It is the class function of a
// bucket.Route that gives each model its limits.
func KeyModel(key string) string {
	if i := strings.Index(key, "://"); i >= 0 {
		key = key[i+3:]
	}
	if j := strings.IndexByte(key, '/'); j >= 0 {
		return key[j+1:]
	}
	return ""
}

// maxModelBody bounds what ModelKey reads of a body to find its model.
const maxModelBody = 8 << 20

// ModelKey keys a request by whose quota it draws on and by the model it
// asks for, as OpenAI and Anthropic limit each model apart:
// transport.CredentialKey (the host and a fingerprint of the API key) or,
// if the request names its organisation in an OpenAI-Organization header,
// the host and that organisation, since an organisation's API keys share
// its limits; then "/" and the "model" of the JSON body. The body is read
// from a copy (GetBody), at most 8 MiB of it; a request with no such body,
// or no model in it, gets the key without a model.
func ModelKey(r *http.Request) string {
	key := transport.CredentialKey(r)
	if org := r.Header.Get("OpenAI-Organization"); org != "" {
		if strings.ContainsAny(org, "/{}") || len(org) > maxModelName {
			org = transport.Fingerprint(org) // not an organisation's ID: keep the key's shape
		}
		key = transport.HostKey(r) + "#" + org
	}
	if m := bodyModel(r); m != "" {
		key += "/" + m
	}
	return key
}

// bodyModel returns the "model" of r's JSON body, or "".
func bodyModel(r *http.Request) string {
	h, ok := readHead(r)
	if !ok || len(h.Model) > maxModelName {
		return ""
	}
	return h.Model
}

// head is what the presets read of a request's JSON body besides its
// cost: its model and its cap on the completion.
type head struct {
	Model               string `json:"model"`
	MaxTokens           int    `json:"max_tokens"`
	MaxCompletionTokens int    `json:"max_completion_tokens"`
}

// readHead decodes the head of r's JSON body, from a copy, at most 8 MiB
// of it, keeping nothing else.
func readHead(r *http.Request) (head, bool) {
	var h head
	if r == nil || r.GetBody == nil || r.Body == nil || r.Body == http.NoBody {
		return h, false
	}
	body, err := r.GetBody()
	if err != nil {
		return h, false
	}
	defer body.Close()
	return h, json.NewDecoder(io.LimitReader(body, maxModelBody)).Decode(&h) == nil
}

// maxModelName bounds a model's name in a key: a longer one is no model's.
const maxModelName = 256
