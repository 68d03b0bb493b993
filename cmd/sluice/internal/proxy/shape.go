package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// shape is the error body a provider's SDK understands.
type shape uint8

const (
	shapeOpenAI    shape = iota // {"error": {"message", "type", "param", "code"}}
	shapeAnthropic              // {"type": "error", "error": {"type", "message"}}
	shapeGemini                 // {"error": {"code", "message", "status"}}
)

// shapeOf is the shape of a route's preset.
func shapeOf(preset string) shape {
	switch preset {
	case presetAnthropic:
		return shapeAnthropic
	case presetGemini:
		return shapeGemini
	}
	return shapeOpenAI
}

// shapeOfPath guesses the shape of a request that matched no route, from
// its path: Anthropic's /v1/messages, Gemini's models/NAME:method, or
// else OpenAI's, which most SDKs read.
func shapeOfPath(path string) shape {
	switch {
	case strings.HasSuffix(path, "/messages") || strings.Contains(path, "/messages/"):
		return shapeAnthropic
	case strings.Contains(path, "/models/") && strings.Contains(path, ":"):
		return shapeGemini
	}
	return shapeOpenAI
}

// apiError is an error the proxy answers itself.
type apiError struct {
	status int
	kind   kind
	msg    string
}

// kind is what went wrong, named in each shape's terms.
type kind uint8

const (
	kindNotFound kind = iota
	kindTooLarge
	kindRateLimit
	kindUnavailable
	kindUpstream
	kindInvalid
)

// names of each kind: OpenAI's type and code, Anthropic's type, Gemini's
// status.
var kindNames = [...]struct{ openAIType, openAICode, anthropic, gemini string }{
	kindNotFound:    {"invalid_request_error", "not_found", "not_found_error", "NOT_FOUND"},
	kindTooLarge:    {"invalid_request_error", "request_too_large", "request_too_large", "INVALID_ARGUMENT"},
	kindRateLimit:   {"rate_limit_error", "rate_limit_exceeded", "rate_limit_error", "RESOURCE_EXHAUSTED"},
	kindUnavailable: {"server_error", "service_unavailable", "api_error", "UNAVAILABLE"},
	kindUpstream:    {"server_error", "bad_gateway", "api_error", "UNAVAILABLE"},
	kindInvalid:     {"invalid_request_error", "invalid_request", "invalid_request_error", "INVALID_ARGUMENT"},
}

// body returns e as s writes its errors.
func (e apiError) body(s shape) []byte {
	n := kindNames[e.kind]
	var v any
	switch s {
	case shapeAnthropic:
		v = map[string]any{"type": "error", "error": map[string]any{"type": n.anthropic, "message": e.msg}}
	case shapeGemini:
		v = map[string]any{"error": map[string]any{"code": e.status, "message": e.msg, "status": n.gemini}}
	default:
		v = map[string]any{"error": map[string]any{"message": e.msg, "type": n.openAIType, "param": nil, "code": n.openAICode}}
	}
	b, _ := json.Marshal(v)
	return b
}

// maxRetryAfter is the longest delay a 429 of the proxy's asks for.
const maxRetryAfter = 24 * time.Hour

// write answers e in shape s. A positive retry sets retry-after-ms,
// retry-after (whole seconds, rounded up) and x-should-retry: true, which
// the official SDKs honour; retry < 0 sets x-should-retry: false.
func (e apiError) write(w http.ResponseWriter, s shape, retry time.Duration) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	switch {
	case retry > 0:
		retry = min(retry, maxRetryAfter) // a bucket's "never" is math.MaxInt64
		ms := (retry + time.Millisecond - 1) / time.Millisecond
		h.Set("Retry-After-Ms", strconv.FormatInt(int64(ms), 10))
		h.Set("Retry-After", strconv.FormatInt(int64((retry+time.Second-1)/time.Second), 10))
		h.Set("X-Should-Retry", "true")
	case retry < 0:
		h.Set("X-Should-Retry", "false")
	}
	body := e.body(s)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(e.status)
	w.Write(body)
}
