package llmclient

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
)

// MeterUsage is the usage extractor to pass to transport.WithUsage: it
// reads the tokens a call used from a successful (2xx) response of an
// OpenAI-compatible or Anthropic API, as the caller reads the body, holding
// no more of it than one server-sent event or the usage object:
//
//   - a JSON body's top-level "usage" object;
//   - an event stream's events with a "usage" object, at the top level or
//     in "message" (Anthropic's message_start) or "response" (OpenAI's
//     Responses API); later events override earlier ones field by field.
//     OpenAI's chat completions stream one only if the request sets
//     stream_options.include_usage, as Client.ChatStream does. The usage
//     counts only once it is final: Anthropic's message_start reports the
//     input and an output of a token or so, and its message_delta the
//     output in full; a stream that ends between the two reports nothing,
//     and its charge stands. And only once the stream has ended: read to
//     its end, or to its last event (OpenAI's data: [DONE], Anthropic's
//     message_stop, the Responses API's response.completed, whose usage is
//     in "response"). A stream the caller closes before that, or that
//     breaks off, reports nothing, even if it reported a usage as it went
//     (cumulative counts with every chunk): the provider counts what it
//     generated, and the charge (the estimate, with max_tokens) stands.
//
// The tokens are total_tokens, or else the sum of prompt_tokens,
// completion_tokens, input_tokens, cache_creation_input_tokens and
// output_tokens (Anthropic's cache reads do not count against its limits).
// A usage with input_tokens or output_tokens (Anthropic's, OpenAI's
// Responses API) reports bucket.InputTokens (input_tokens plus
// cache_creation_input_tokens) and bucket.OutputTokens as well, for a bucket
// limited as Anthropic limits (see AnthropicCost); a dimension the bucket
// does not limit is ignored.
// A field that is negative is taken as absent, and one that JSON cannot
// hold in a float64 spoils its object; what the meter reports beyond
// reason (infinite, or above 1e9) the Transport ignores (see
// transport.WithUsage).
// Other responses, and compressed bodies the caller decompresses, are not
// metered (nil): their charge stands. An event stream's meter is a
// transport.StreamMeter, and a transport.FeedbackMeter too: an error event that speaks of the limit
// (adaptive.ParseStreamError: Anthropic's overloaded_error or
// rate_limit_error, OpenAI's rate_limit_exceeded) is observed by the bucket.
func MeterUsage(resp *http.Response) transport.UsageMeter {
	if resp.StatusCode < 200 || resp.StatusCode > 299 || resp.Header.Get("Content-Encoding") != "" {
		return nil
	}
	mt, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	switch {
	case mt == "text/event-stream":
		return newSSEMeter()
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		return &jsonMeter{u: noUsage}
	}
	return nil
}

// MeterOpenAIUsage is MeterUsage for OpenAI's limits, the OpenAI preset's:
// a chat completion that sets a cap on its completion (max_completion_tokens,
// else max_tokens) is reckoned at its prompt's tokens plus the cap, or its
// usage if that is more, since OpenAI counts the cap against the tokens
// limit whatever the completion uses; what is reconciled is the estimate of
// the prompt. Reconciled to the usage, the bucket would hand the unused cap
// out again, and the fleet would be refused for it. A call without a cap is
// reconciled to its usage.
func MeterOpenAIUsage(resp *http.Response) transport.UsageMeter {
	m := MeterUsage(resp)
	if m == nil {
		return nil
	}
	h, err := readHead(resp.Request)
	if err != nil {
		return m
	}
	c := h.MaxCompletionTokens
	if c <= 0 {
		c = h.MaxTokens
	}
	if c <= 0 {
		return m
	}
	switch m := m.(type) {
	case *jsonMeter:
		m.cap = float64(c)
	case *sseMeter:
		m.cap = float64(c)
	}
	return m
}

// usage is a usage object of any of the providers; a field the object
// lacks is -1 (see noUsage).
type usage struct {
	Total         float64 `json:"total_tokens"`
	Prompt        float64 `json:"prompt_tokens"`
	Completion    float64 `json:"completion_tokens"`
	Input         float64 `json:"input_tokens"`
	CacheCreation float64 `json:"cache_creation_input_tokens"`
	Output        float64 `json:"output_tokens"`
}

// noUsage is the usage to decode into: fields absent from the JSON stay -1.
var noUsage = usage{-1, -1, -1, -1, -1, -1}

func (u *usage) fields() [6]*float64 {
	return [...]*float64{&u.Total, &u.Prompt, &u.Completion, &u.Input, &u.CacheCreation, &u.Output}
}

// merge sets the fields v has, and reports whether it has any.
func (u *usage) merge(v *usage) bool {
	dst, has := u.fields(), false
	for i, f := range v.fields() {
		if *f >= 0 {
			*dst[i], has = *f, true
		}
	}
	return has
}

// cost returns the tokens u reports, if it reports any; with a cap > 0 on
// the completion, at least the prompt's tokens plus the cap (see
// MeterOpenAIUsage).
func (u *usage) cost(cap float64) (bucket.Cost, bool) {
	n, found := u.Total, u.Total >= 0
	if !found {
		n = 0
		f := u.fields()
		for _, f := range f[1:] {
			if *f >= 0 {
				n, found = n+*f, true
			}
		}
	}
	if !found {
		return nil, false
	}
	if cap > 0 && u.Prompt >= 0 {
		n = max(n, u.Prompt+cap)
	}
	c := bucket.Cost{bucket.Tokens: n}
	if u.Input >= 0 || u.CacheCreation >= 0 {
		c[bucket.InputTokens] = max(u.Input, 0) + max(u.CacheCreation, 0)
	}
	if u.Output >= 0 {
		c[bucket.OutputTokens] = u.Output
	}
	return c, true
}

// maxUsage bounds the bytes kept of a JSON body's usage object.
const maxUsage = 4 << 10

// jsonMeter finds a JSON body's top-level "usage" object as the bytes go
// by, with a scanner that knows strings, nesting and nothing else; it keeps
// the usage object only.
type jsonMeter struct {
	depth   int  // objects and arrays open
	str     bool // inside a string
	esc     bool // after a backslash inside a string
	key     int  // bytes of "usage" matched by the current top-level string; -1: no match
	colon   bool // a top-level "usage" string just closed
	value   bool // after `"usage":`, before the value
	capture bool // inside the usage object, copying it to buf
	done    bool // found, or given up
	buf     []byte
	cap     float64 // see MeterOpenAIUsage
	u       usage   // from noUsage
	found   bool
}

const usageKey = "usage"

// Write scans p, the body's next bytes, for its top-level "usage" object.
// It never fails: a body it cannot follow reports no usage.
func (m *jsonMeter) Write(p []byte) (int, error) {
	start := 0 // of the usage object in p, while capturing
	for i := 0; i < len(p) && !m.done; i++ {
		if m.str {
			i = m.inString(p, i)
		} else {
			start = m.token(p, i, start)
		}
	}
	if m.capture {
		m.keep(p[start:])
	}
	return len(p), nil
}

// inString reads p[i], a byte inside a string, and returns the index of
// the last byte it read: past p[i], it skips the bytes that can neither end
// the string nor match "usage", up to the next quote or backslash.
func (m *jsonMeter) inString(p []byte, i int) int {
	c := p[i]
	switch {
	case m.esc:
		m.esc, m.key = false, -1
	case c == '\\':
		m.esc, m.key = true, -1
	case c == '"':
		m.str = false
		m.colon = m.key == len(usageKey)
	case m.key >= 0 && m.key < len(usageKey) && c == usageKey[m.key]:
		m.key++
	default:
		// Not a key being matched: skip to the next quote or backslash.
		m.key = -1
		return i + plainLen(p[i+1:])
	}
	return i
}

// plainLen returns how many bytes of s, the rest of a string, come before
// its next quote or backslash: all of them if it has neither.
func plainLen(s []byte) int {
	n := len(s)
	if j := bytes.IndexByte(s, '"'); j >= 0 {
		n = j
	}
	if k := bytes.IndexByte(s[:n], '\\'); k >= 0 {
		n = k
	}
	return n
}

// token reads p[i], a byte outside any string: it follows the nesting,
// and the key "usage" at the top level, its colon and its value. It
// returns where the usage object starts in p: i if it opens at i, else
// start.
func (m *jsonMeter) token(p []byte, i, start int) int {
	c := p[i]
	switch c {
	case ' ', '\t', '\n', '\r':
		return start
	}
	colon, value := m.colon, m.value
	m.colon, m.value = false, false
	switch c {
	case '"':
		m.str, m.key = true, -1
		if m.depth == 1 {
			m.key = 0
		}
	case ':':
		m.value = colon
	case '{', '[':
		m.depth++
		if value && c == '{' {
			m.capture, start = true, i
		}
	case '}', ']':
		m.depth--
		if m.capture && m.depth == 1 {
			m.endUsage(p[start : i+1])
		}
	}
	return start
}

// endUsage keeps b, the usage object's last bytes, and decodes the object;
// the scan is done.
func (m *jsonMeter) endUsage(b []byte) {
	m.capture, m.done = false, true
	if m.keep(b) && json.Unmarshal(m.buf, &m.u) == nil {
		m.found = true
	}
}

// keep appends b to the usage object kept, and gives up if it grows past
// maxUsage.
func (m *jsonMeter) keep(b []byte) bool {
	if len(m.buf)+len(b) > maxUsage {
		m.capture, m.done, m.buf = false, true, nil
		return false
	}
	m.buf = append(m.buf, b...)
	return true
}

func (m *jsonMeter) Cost() (bucket.Cost, bool) {
	if !m.found {
		return nil, false
	}
	return m.u.cost(m.cap)
}

// maxEvent bounds the bytes kept of one server-sent event.
const maxEvent = 1 << 20

// sseMeter reads the usage of an event stream, one event at a time, and
// the last error event that speaks of the limit (adaptive.ParseStreamError).
type sseMeter struct {
	dec   sseDecoder
	u     usage // from noUsage, merged with every usage found
	final bool  // a final usage was found: at the top level or in "response"
	ended bool  // the stream ended: its last event was seen, or End was called
	fb    adaptive.Feedback
	hasFB bool
	cap   float64 // see MeterOpenAIUsage
	chunk bool    // an OpenAI chat.completion.chunk was seen
}

func newSSEMeter() *sseMeter {
	m := &sseMeter{u: noUsage}
	m.dec = sseDecoder{limit: maxEvent, event: m.event}
	return m
}

func (m *sseMeter) Write(p []byte) (int, error) { return m.dec.Write(p) }

// End implements transport.StreamMeter: the stream was read to its end.
func (m *sseMeter) End() { m.ended = true }

// tokensField is in every usage object, and in few other events;
// errorField in every error event.
var (
	tokensField = []byte(`_tokens"`)
	errorField  = []byte(`"error"`)
	chunkObject = []byte(`"chat.completion.chunk"`)
	doneData    = []byte(`[DONE]`)
	messageStop = []byte(`"message_stop"`)
)

// event reads the usage of an event, if it has one, and what an error event
// says of the limit. An event too large to keep is skipped.
func (m *sseMeter) event(data []byte, tooLarge bool) bool {
	if tooLarge {
		return true
	}
	m.chunk = m.chunk || bytes.Contains(data, chunkObject)
	if bytes.Equal(data, doneData) || bytes.Contains(data, messageStop) && eventType(data) == "message_stop" {
		m.ended = true // OpenAI's last event, or Anthropic's
	}
	if bytes.Contains(data, errorField) {
		if fb, ok := adaptive.ParseStreamError(data); ok {
			m.fb, m.hasFB = fb, true
		}
	}
	if !bytes.Contains(data, tokensField) {
		return true
	}
	type nested struct {
		Usage usage `json:"usage"`
	}
	ev := struct {
		Usage    usage  `json:"usage"`
		Message  nested `json:"message"`
		Response nested `json:"response"`
	}{noUsage, nested{noUsage}, nested{noUsage}}
	if json.Unmarshal(data, &ev) == nil {
		m.u.merge(&ev.Message.Usage) // message_start's: not final
		if m.u.merge(&ev.Usage) {
			m.final = true
		}
		if m.u.merge(&ev.Response.Usage) {
			// The Responses API reports it only in its last event
			// (response.completed, .incomplete or .failed).
			m.final, m.ended = true, true
		}
	}
	return true
}

// eventType returns the "type" of data, an event's JSON object, or "".
func eventType(data []byte) string {
	var ev struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return ""
	}
	return ev.Type
}

func (m *sseMeter) Cost() (bucket.Cost, bool) {
	m.dec.flush() // a last line with no newline, a last event with no blank line
	switch {
	case !m.ended: // closed or broken off: a usage seen so far is not final
		return nil, false
	case !m.final:
		if m.chunk {
			warnNoUsage()
		}
		return nil, false
	}
	return m.u.cost(m.cap)
}

// everyMinute says when something may be logged again: once a minute at
// most, whatever the number of goroutines asking.
type everyMinute struct {
	last atomic.Int64 // when it was last due, Unix ns
}

// due reports whether a minute has passed since it was last due, and if
// so starts the next minute.
func (e *everyMinute) due() bool {
	now, last := time.Now().UnixNano(), e.last.Load()
	return now-last >= int64(time.Minute) && e.last.CompareAndSwap(last, now)
}

// warnedNoUsage limits warnNoUsage to once a minute.
var warnedNoUsage everyMinute

// warnNoUsage logs, at most once a minute, that a chat completion stream
// ended without a usage: its charge stands unreconciled.
func warnNoUsage() {
	if !warnedNoUsage.due() {
		return
	}
	slog.Default().LogAttrs(context.Background(), slog.LevelWarn,
		"sluice: a streamed chat completion reported no usage, so its charge (the prompt's estimate and max_tokens) "+
			"was not reconciled: set stream_options.include_usage (openai-go: StreamOptions.IncludeUsage) in streamed requests")
}

// Feedback implements transport.FeedbackMeter: the last error event of the
// stream that spoke of the limit, such as Anthropic's overloaded_error.
func (m *sseMeter) Feedback() (adaptive.Feedback, bool) { return m.fb, m.hasFB }
