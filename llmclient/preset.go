package llmclient

import (
	"context"
	"log/slog"
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

// UnknownModel is the model ModelKey gives a call whose body has a model
// it cannot read: a body that is not a JSON object, is malformed, is past
// 64 MiB, or cannot be read again (no GetBody), or whose "model" is not a
// string of at most 256 bytes. Such calls share one key per credential,
// and bucket.Route, given llmclient.KeyModel, charges them to
// plan[UnknownModel]: give that class the limits of the plan's strictest
// model, so that no call escapes a model's limits by hiding its model
// (without it they go to the plan's default). A provider refuses a body
// that is malformed or that large (Anthropic's Messages API takes 32 MB at
// most), so most such calls spend little of any model's quota; a body
// without GetBody is sent as it is, and http.NewRequest sets GetBody for
// the bodies SDKs send (bytes and strings). ModelKey logs them, once a
// minute at most.
const UnknownModel = "?"

// ModelKey keys a request by whose quota it draws on and by the model it
// asks for, as OpenAI and Anthropic limit each model apart:
// transport.CredentialKey (the host and a fingerprint of the API key) or,
// if the request names its organisation in an OpenAI-Organization header,
// the host and that organisation, since an organisation's API keys share
// its limits; then "/" and the "model" of the JSON body. The body is read
// from a copy (GetBody), wherever its "model" sits in it, without being
// held twice in memory; a request with no body, or a JSON object with no
// model, gets the key without a model, and one whose model cannot be read
// gets UnknownModel.
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

// bodyModel returns the "model" of r's JSON body, "" if it has none, or
// UnknownModel if it cannot be read.
func bodyModel(r *http.Request) string {
	h, err := readHead(r)
	switch {
	case err == errNoBody:
		return ""
	case err != nil:
		warnUnknownModel(r, err.Error())
		return UnknownModel
	case h.BadModel:
		warnUnknownModel(r, "a model that is not a string of at most 256 bytes")
		return UnknownModel
	}
	return h.Model
}

// unknownModelWarned limits warnUnknownModel to once a minute.
var unknownModelWarned everyMinute

// warnUnknownModel logs, at most once a minute, that a call to r's host
// was keyed under UnknownModel, and why.
func warnUnknownModel(r *http.Request, why string) {
	if !unknownModelWarned.due() {
		return
	}
	slog.Default().LogAttrs(context.Background(), slog.LevelWarn,
		"sluice: a request's model could not be read from its body, so it is keyed under llmclient.UnknownModel: "+
			"give that class your strictest model's limits in bucket.Route",
		slog.String("host", r.URL.Host), slog.String("reason", why))
}

// maxModelName bounds a model's name in a key: a longer one is no model's.
const maxModelName = 256
