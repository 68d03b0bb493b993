package adaptive

import (
	"encoding/json"
	"errors"
	"strings"
	"time"
)

// Body is what the JSON error body of a refusal says about it.
type Body struct {
	// QuotaExhausted: the account is out of quota or credit, which no wait
	// short of a new billing period or a new day will fix.
	QuotaExhausted bool
	// RetryAfter is the delay the body asks for, zero if it asks for none.
	RetryAfter time.Duration
}

// ParseBody returns what body, the start of a refusal's body, says:
//
//   - QuotaExhausted for OpenAI's insufficient_quota (as its code or type)
//     or billing_hard_limit_reached, Anthropic's billing_error or its
//     "credit balance is too low", and Gemini's google.rpc.QuotaFailure
//     with a violation of a daily quota (a quotaId with "PerDay", as
//     "GenerateRequestsPerDayPerProjectPerModel-FreeTier", or a quotaMetric
//     with "per_day"): Gemini asks even then for a retry in seconds, which
//     would be refused again until the day is over;
//   - RetryAfter from Gemini's google.rpc.RetryInfo, whose retryDelay is a
//     protobuf Duration in its JSON form ("3s", "1.5s", "0.250s"), unless
//     the message states the same delay more exactly (within the second
//     after it: Gemini truncates the RetryInfo to whole seconds, "59s" for
//     "Please retry in 59.322187034s.", "0s" for "in 356.313387ms."); else
//     from the error's message text: "try again in" (OpenAI: "Please try
//     again in 6.379s.", "in 1m30s", "in 20ms"), "retry in" (Gemini's
//     message: "Please retry in 39.010806355s.") or "retry after" (Azure:
//     "Please retry after 17 seconds."), followed by a duration as Go writes
//     it ("1h2m3.5s") or a number and "second(s)", "millisecond(s)" or
//     "ms".
//
// The error is the object under the top-level "error" key, as OpenAI,
// Anthropic, Gemini and their imitators write it. Any other body, one that
// is not JSON (a body cut short included), or a malformed delay or one of
// 292 years or more, says nothing.
func ParseBody(body []byte) Body {
	var v struct {
		Error errorObject `json:"error"`
	}
	// A field of another type (Gemini's numeric code) leaves the others read.
	var typeErr *json.UnmarshalTypeError
	if err := json.Unmarshal(body, &v); err != nil && !errors.As(err, &typeErr) {
		return Body{}
	}
	e := &v.Error
	b := Body{QuotaExhausted: e.spentQuota() || dailyQuotaFailure(e.Details)}
	var hasInfo bool
	b.RetryAfter, hasInfo = retryInfo(e.Details)
	// Gemini truncates the RetryInfo to whole seconds ("59s", "0s") and
	// states the delay exactly in its message ("Please retry in
	// 59.322187034s.", "in 356.313387ms."): a retry at the truncated delay
	// comes up to a second early, into a window that has not freed yet.
	if m, ok := messageDelay(e.Message); ok && (!hasInfo || m >= b.RetryAfter && m-b.RetryAfter < time.Second) {
		b.RetryAfter = m
	}
	return b
}

// errorObject is what ParseBody reads of the object under a body's
// top-level "error" key.
type errorObject struct {
	Type    string        `json:"type"`
	Code    string        `json:"code"`
	Message string        `json:"message"`
	Details []errorDetail `json:"details"`
}

// errorDetail is one of Gemini's details: a google.rpc.RetryInfo, a
// google.rpc.QuotaFailure or another, by its @type.
type errorDetail struct {
	Type       string `json:"@type"`
	RetryDelay string `json:"retryDelay"`
	Violations []struct {
		QuotaMetric string `json:"quotaMetric"`
		QuotaID     string `json:"quotaId"`
	} `json:"violations"`
}

// spentQuota reports whether e's code, type or message says the account
// is out of quota or credit, as OpenAI and Anthropic say it.
func (e *errorObject) spentQuota() bool {
	switch {
	case e.Code == "insufficient_quota", e.Type == "insufficient_quota",
		e.Code == "billing_hard_limit_reached", e.Type == "billing_error",
		strings.Contains(e.Message, "credit balance is too low"):
		return true
	}
	return false
}

// dailyQuotaFailure reports whether a google.rpc.QuotaFailure among
// details has a violation of a daily quota.
func dailyQuotaFailure(details []errorDetail) bool {
	for _, d := range details {
		if d.Type != "type.googleapis.com/google.rpc.QuotaFailure" {
			continue
		}
		for _, q := range d.Violations {
			if strings.Contains(q.QuotaID, "PerDay") || strings.Contains(q.QuotaMetric, "per_day") {
				return true
			}
		}
	}
	return false
}

// retryInfo returns the delay of the first google.rpc.RetryInfo among
// details with a well-formed retryDelay, and whether there is one.
func retryInfo(details []errorDetail) (time.Duration, bool) {
	for _, d := range details {
		if d.Type != "type.googleapis.com/google.rpc.RetryInfo" {
			continue
		}
		if delay, ok := protoDuration(d.RetryDelay); ok {
			return delay, true
		}
	}
	return 0, false
}

// WithBody returns f amended by b, what the body of f's response says
// (ParseBody): a RateLimited f whose body says the quota is spent is
// QuotaExhausted, and a refusal (any Class but Accepted) whose headers ask
// for no delay takes the body's, which then pauses the key as a
// Retry-After would. An Accepted f is returned as it is: a delay in the body
// of a 400 or a 500 asks at most for that request to be retried.
func (f Feedback) WithBody(b Body) Feedback {
	if f.Class == Accepted {
		return f
	}
	if f.Class == RateLimited && b.QuotaExhausted {
		f.Class = QuotaExhausted
	}
	if f.RetryAfter <= 0 && b.RetryAfter > 0 {
		f.RetryAfter, f.HasRetryAfter = b.RetryAfter, true
	}
	return f
}

// protoDuration parses s, a google.protobuf.Duration in its JSON form: a
// decimal number of seconds followed by "s" ("3s", "1.5s", "0.250s"). A
// sign, an exponent or a duration of 292 years or more is refused; a
// fraction is rounded up to the nanosecond.
func protoDuration(s string) (time.Duration, bool) {
	num, ok := strings.CutSuffix(s, "s")
	if !ok {
		return 0, false
	}
	whole, frac, ok := decimal(num)
	if !ok {
		return 0, false
	}
	return below(scale(whole, frac, time.Second))
}

// delayPhrases introduce a delay in an error message.
var delayPhrases = [...]string{"try again in ", "retry in ", "retry after "}

// delayUnits are the words for a unit after a bare number in a message.
var delayUnits = [...]struct {
	word string
	d    time.Duration
}{
	{"seconds", time.Second}, {"second", time.Second}, {"secs", time.Second}, {"sec", time.Second},
	{"milliseconds", time.Millisecond}, {"millisecond", time.Millisecond}, {"ms", time.Millisecond},
}

// messageDelay returns the delay msg states after one of delayPhrases (in
// any case; the phrases tried in their order, each where it first comes
// with a well-formed delay), and whether it states one (see ParseBody).
func messageDelay(msg string) (time.Duration, bool) {
	lower := strings.ToLower(msg)
	for _, p := range delayPhrases {
		for rest := lower; ; {
			i := strings.Index(rest, p)
			if i < 0 {
				break
			}
			rest = rest[i+len(p):]
			if d, ok := delayAt(rest); ok {
				return d, true
			}
		}
	}
	return 0, false
}

// delayAt reads the delay s starts with: a Go duration ("6.379s",
// "1m30s") or a number then a unit word ("17 seconds"), either one ending
// at a space, at the end, or at punctuation that ends a sentence.
func delayAt(s string) (time.Duration, bool) {
	word, rest, _ := strings.Cut(s, " ")
	word = strings.TrimRight(word, ".,;:!)")
	if word == "" {
		return 0, false
	}
	if whole, frac, ok := decimal(word); ok {
		unit, _, _ := strings.Cut(rest, " ")
		unit = strings.TrimRight(unit, ".,;:!)")
		for _, u := range delayUnits {
			if u.word == unit {
				return below(scale(whole, frac, u.d))
			}
		}
		return 0, false
	}
	return goDuration(word)
}

// ParseStreamError returns what data, the data of one event of a stream
// whose response was a 2xx, says about the limit, if it is an error that
// speaks of it:
//
//   - Overloaded for Anthropic's overloaded_error ({"type":"error",
//     "error":{"type":"overloaded_error",...}}, its 529 in mid-stream);
//   - RateLimited for Anthropic's rate_limit_error and for OpenAI's
//     rate_limit_exceeded (as the error's code or type);
//   - QuotaExhausted for what ParseBody takes for a spent quota;
//
// with the delay ParseBody finds in it. Any other event, an error of
// another kind (a server error says nothing of the limit) or data that is
// not JSON says nothing.
func ParseStreamError(data []byte) (Feedback, bool) {
	var v struct {
		Error *struct {
			Type string `json:"type"`
			Code any    `json:"code"` // a string, or Gemini's number
		} `json:"error"`
	}
	if json.Unmarshal(data, &v) != nil || v.Error == nil {
		return Feedback{}, false
	}
	code, _ := v.Error.Code.(string)
	b := ParseBody(data)
	var f Feedback
	switch {
	case b.QuotaExhausted:
		f.Class = QuotaExhausted
	case v.Error.Type == "overloaded_error" || code == "overloaded_error":
		f.Class = Overloaded
	case v.Error.Type == "rate_limit_error", v.Error.Type == "rate_limit_exceeded", code == "rate_limit_exceeded":
		f.Class = RateLimited
	default:
		return Feedback{}, false
	}
	return f.WithBody(b), true
}
