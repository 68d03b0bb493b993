package llmtest

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Headers is a set of header styles in which a Handler reports its limits
// on every response the limit decided (200 and 429). Combine styles with |;
// the zero Headers reports nothing. Each style reports every limited
// dimension it has names for (OpenAI's and the IETF's: Requests and
// Tokens; Anthropic's: all four): its capacity (a token bucket's burst, a
// window's n), what would fit now, and how long until nothing counts
// against it (a bucket full, a window empty).
type Headers uint8

const (
	// OpenAIHeaders are x-ratelimit-limit-requests,
	// x-ratelimit-remaining-requests, x-ratelimit-reset-requests and the
	// same for tokens, with resets as OpenAI writes them: Go durations
	// rounded up to the millisecond ("1s", "6m0s", "20ms", "1.5s").
	OpenAIHeaders Headers = 1 << iota
	// AnthropicHeaders are anthropic-ratelimit-requests-limit,
	// anthropic-ratelimit-requests-remaining,
	// anthropic-ratelimit-requests-reset and the same for input-tokens
	// (InputTokens), output-tokens (OutputTokens) and tokens, with resets
	// as RFC 3339 times in UTC, rounded up to the second. The tokens-*
	// headers report, as Anthropic documents, the most restrictive of the
	// token limits (Tokens, InputTokens, OutputTokens) in effect: the one
	// with the least remaining, of equals the one that resets last, of
	// equals the first named. Anthropic's limits are per minute (a bucket
	// of the limit, refilled over a minute), and sluice reads them so: give
	// the server limits per minute with these headers. Unlike Anthropic,
	// which rounds what remains to the thousand, the fake reports it
	// exactly.
	AnthropicHeaders
	// IETFHeaders are the RateLimit-Policy and RateLimit fields of
	// draft-ietf-httpapi-ratelimit-headers, one policy per dimension named
	// for it: `RateLimit-Policy: "requests";q=20;w=1, "tokens";q=4000;w=60`
	// and `RateLimit: "requests";r=5;t=1, "tokens";r=3000;t=15`. Windows
	// (w) and resets (t) are whole seconds rounded up, w at least 1; a
	// token bucket's window is the time it takes to fill. The draft
	// registers no quota unit for tokens, so the tokens policy has no qu:
	// its name says what it counts.
	IETFHeaders
)

// quota is what the headers report about one limited dimension.
type quota struct {
	limit     Limit
	remaining int64
	reset     time.Duration
}

// write sets the headers of styles hs for the quotas of the limited
// dimensions (nil entries are unlimited) at now.
func (hs Headers) write(h http.Header, qs *[numDims]*quota, now time.Time) {
	if hs&AnthropicHeaders != 0 {
		writeAnthropic(h, qs, now)
	}
	var policy, state []string
	for d, q := range qs {
		if q == nil || Dimension(d) > Tokens {
			continue
		}
		name := Dimension(d).String()
		limit := strconv.FormatInt(q.limit.capacity(), 10)
		remaining := strconv.FormatInt(q.remaining, 10)
		if hs&OpenAIHeaders != 0 {
			h.Set("X-Ratelimit-Limit-"+name, limit)
			h.Set("X-Ratelimit-Remaining-"+name, remaining)
			h.Set("X-Ratelimit-Reset-"+name, openAIDuration(q.reset))
		}
		if hs&IETFHeaders != 0 {
			w := max(1, ceilSeconds(q.limit.window()))
			policy = append(policy, `"`+name+`";q=`+limit+";w="+strconv.FormatInt(w, 10))
			state = append(state, `"`+name+`";r=`+remaining+";t="+strconv.FormatInt(ceilSeconds(q.reset), 10))
		}
	}
	if len(policy) > 0 {
		h.Set("RateLimit-Policy", strings.Join(policy, ", "))
		h.Set("RateLimit", strings.Join(state, ", "))
	}
}

// writeAnthropic sets the anthropic-ratelimit-* headers of the quotas of
// the limited dimensions (nil entries are unlimited) at now, the tokens-*
// ones of the most restrictive token limit.
func writeAnthropic(h http.Header, qs *[numDims]*quota, now time.Time) {
	set := func(name string, q *quota) {
		at := now.Add(q.reset)
		if t := at.Truncate(time.Second); t.Before(at) {
			at = t.Add(time.Second)
		}
		h.Set("Anthropic-Ratelimit-"+name+"-Limit", strconv.FormatInt(q.limit.capacity(), 10))
		h.Set("Anthropic-Ratelimit-"+name+"-Remaining", strconv.FormatInt(q.remaining, 10))
		h.Set("Anthropic-Ratelimit-"+name+"-Reset", at.UTC().Format(time.RFC3339))
	}
	if q := qs[Requests]; q != nil {
		set("Requests", q)
	}
	var strictest *quota
	for _, d := range [...]Dimension{Tokens, InputTokens, OutputTokens} {
		q := qs[d]
		if q == nil {
			continue
		}
		switch d {
		case InputTokens:
			set("Input-Tokens", q)
		case OutputTokens:
			set("Output-Tokens", q)
		}
		if strictest == nil || q.remaining < strictest.remaining ||
			q.remaining == strictest.remaining && q.reset > strictest.reset {
			strictest = q
		}
	}
	if strictest != nil {
		set("Tokens", strictest)
	}
}

// setRetryAfter sets Retry-After to wait in whole seconds, rounded up, and
// if ms, retry-after-ms to wait in milliseconds, rounded up.
func setRetryAfter(h http.Header, wait time.Duration, ms bool) {
	h.Set("Retry-After", strconv.FormatInt(ceilSeconds(wait), 10))
	if ms {
		h.Set("Retry-After-Ms", strconv.FormatInt(ceilDiv(int64(wait), int64(time.Millisecond)), 10))
	}
}

// openAIDuration formats d as OpenAI's x-ratelimit-reset headers do: a Go
// duration rounded up to the millisecond.
func openAIDuration(d time.Duration) string {
	return time.Duration(ceilDiv(int64(d), int64(time.Millisecond)) * int64(time.Millisecond)).String()
}

// ceilSeconds returns d (>= 0) in seconds, rounded up.
func ceilSeconds(d time.Duration) int64 { return ceilDiv(int64(d), int64(time.Second)) }
