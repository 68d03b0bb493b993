package llmclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/adaptive"
)

// APIError is an error the provider answered with: a response other than
// 2xx, or an error event in a stream. Requests that the Transport retried
// (429, 503, …) end in an APIError only once its retries are spent.
type APIError struct {
	// StatusCode is the response's HTTP status; 200 for an error event in
	// a stream.
	StatusCode int
	// Type and Code classify the error as the provider does, such as
	// "invalid_request_error" and "rate_limit_exceeded"; either may be
	// empty.
	Type, Code string
	// Message is the provider's description, or the start of the body if
	// it held no error object. The API key never appears in it.
	Message string
	// RetryAfter is how long the response asked to wait before trying
	// again (retry-after-ms or Retry-After); 0 if it did not say.
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "llmclient: %d", e.StatusCode)
	if text := http.StatusText(e.StatusCode); text != "" {
		b.WriteString(" " + text)
	}
	for _, s := range []string{e.Type, e.Code, e.Message} {
		if s != "" {
			b.WriteString(": ")
			b.WriteString(s)
		}
	}
	return b.String()
}

// ErrTooLarge is matched by a *TooLargeError.
var ErrTooLarge = errors.New("llmclient: response too large")

// TooLargeError is the error of a response, or an event of a stream,
// larger than the Client reads (WithMaxResponseBytes). It errors.Is
// ErrTooLarge.
type TooLargeError struct {
	// Limit is the most the Client reads, in bytes.
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("llmclient: response larger than %d bytes (raise the limit with llmclient.WithMaxResponseBytes)", e.Limit)
}

// Is reports whether target is ErrTooLarge.
func (e *TooLargeError) Is(target error) bool { return target == ErrTooLarge }

// maxErrorBody bounds what is read of an error response.
const maxErrorBody = 64 << 10

// maxErrorText bounds the Message taken from a body with no error object.
const maxErrorText = 256

// errorBody is how OpenAI-compatible and Anthropic APIs describe an error.
type errorBody struct {
	Error *struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"` // a string, a number or null
	} `json:"error"`
}

// newAPIError returns the error that a response with this status, header
// and body (or stream event) describes, with secret taken out of its text.
func newAPIError(status int, h http.Header, body []byte, secret string) *APIError {
	redact := func(s string) string {
		if secret == "" {
			return s
		}
		return strings.ReplaceAll(s, secret, "[redacted]")
	}
	ra, _ := adaptive.RetryAfter(h, time.Now())
	e := &APIError{StatusCode: status, RetryAfter: ra}
	var eb errorBody
	if json.Unmarshal(body, &eb) != nil || eb.Error == nil {
		e.Message = redact(strings.TrimSpace(string(body)))
		if len(e.Message) > maxErrorText {
			e.Message = strings.ToValidUTF8(e.Message[:maxErrorText], "") + "…"
		}
		return e
	}
	e.Message, e.Type = redact(eb.Error.Message), redact(eb.Error.Type)
	if json.Unmarshal(eb.Error.Code, &e.Code) != nil && string(eb.Error.Code) != "null" {
		e.Code = string(eb.Error.Code) // a number
	}
	e.Code = redact(e.Code)
	return e
}
