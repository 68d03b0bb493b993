package llmtest

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Config configures a Handler. The zero Config limits nothing, sends no
// quota headers, answers at once and reads the real clock.
type Config struct {
	// Requests and Tokens are the hidden limits; the zero Limit is none.
	// A request is admitted only if both have room for its cost.
	Requests, Tokens Limit
	// InputTokens and OutputTokens are hidden limits on input and output
	// tokens apart, as Anthropic sets them (see Handler for how each is
	// counted); the zero Limit is none.
	InputTokens, OutputTokens Limit
	// Headers are the styles in which responses report the limits; zero
	// sends none, leaving a client only 429 and Retry-After to go by.
	Headers Headers
	// RetryAfterMs adds retry-after-ms, the wait in milliseconds rounded
	// up, to the Retry-After of a 429.
	RetryAfterMs bool
	// RetryAfter, if positive, replaces the wait that a 429's Retry-After
	// (and retry-after-ms) reports, as a proxy in front of an API
	// configured to send a constant header does (nginx's add_header,
	// haproxy's deny ... hdr). Negative sends neither header, as nginx's
	// limit_req and haproxy's deny do by default. Zero reports the wait.
	RetryAfter time.Duration
	// Gemini answers the limits' refusals as the Gemini API does: 429
	// with a google.rpc.Status body (status RESOURCE_EXHAUSTED) whose
	// details are a google.rpc.QuotaFailure naming the refusing limits
	// (per minute, or per day for a window of a day or more) and a
	// google.rpc.RetryInfo whose retryDelay is the wait truncated to whole
	// seconds ("59s", "0s"), and whose message ends with the exact wait
	// ("Please retry in 59.322187034s.", "in 356.313387ms."); and no
	// Retry-After nor retry-after-ms: RetryAfter and RetryAfterMs are
	// ignored. Gemini sends no quota headers either: leave Headers zero to
	// be faithful. A request that can never fit gets the QuotaFailure
	// without a RetryInfo, and no delay in the message.
	Gemini bool
	// ReplyTokens is the length in tokens of every completion, unless the
	// request caps it lower; zero means 16.
	ReplyTokens int
	// ChargeCap makes a chat request cost its prompt plus its cap on the
	// completion (max_completion_tokens, else max_tokens, else ReplyTokens)
	// in tokens, as OpenAI documents that it counts: whatever the completion
	// uses. By default it costs its prompt plus the completion it gets, the
	// usage it reports, as a client that reconciles with the usage counts.
	ChargeCap bool
	// Latency is how long, in real time, an admitted request waits before
	// its response's headers; TokenLatency is how long each completion
	// token then takes: a stream sends one chunk per token, TokenLatency
	// apart. Zero means no wait. The limits' clock does not see them.
	Latency, TokenLatency time.Duration
	// Fault, if not nil, is asked about every request before anything
	// else, with the time by Now; any Fault but NoFault answers the
	// request, which the limits never see. It is called concurrently,
	// with no lock held.
	Fault func(now time.Time) Fault
	// Now is the clock the limits, the counters, Fault and the responses'
	// timestamps read; nil means time.Now. The limits never see time run
	// backwards: a reading before the latest counts as the latest. Now is
	// called concurrently, at times with the handler's lock held: it must
	// not call the handler's methods.
	Now func() time.Time
}

// Fault is a failure that Config.Fault injects ahead of the limits. Each
// answers with an OpenAI error body, without Retry-After or quota headers;
// a value not named here answers 500. On the Messages API the body is
// Anthropic's, and QuotaExhausted answers as Anthropic does when the
// credit balance is too low: 400 with an invalid_request_error.
type Fault uint8

const (
	// NoFault lets the request through to the limits.
	NoFault Fault = iota
	// Overloaded answers 529 with an overloaded_error, as Anthropic does
	// when it is overloaded.
	Overloaded
	// Unavailable answers 503 with a server_error, as OpenAI does when it
	// is overloaded.
	Unavailable
	// QuotaExhausted answers 429 with the code insufficient_quota and no
	// Retry-After, as OpenAI does when the account is out of credit:
	// waiting will not help.
	QuotaExhausted
)

// Handler is the fake API as an http.Handler: a hidden rate limit in front
// of three endpoints.
//
// POST to any path that ends in /chat/completions (Server.URL +
// "/chat/completions") is an OpenAI chat completion. The request costs 1
// request and its usage in tokens (PromptTokens + the completion's length),
// taken at admission; with Config.ChargeCap, PromptTokens + its cap; its
// prompt in input tokens, taken at admission; and its cap in output tokens,
// taken at admission, of which the part the completion does not use is
// given back once the response is written (see Anthropic's rules below).
// The cap is max_completion_tokens, else max_tokens, else ReplyTokens. The
// completion is min(cap, ReplyTokens) tokens of
// lorem ipsum, 4 characters a token (finish_reason "length" if the cap cut
// it short, else "stop"), with its usage; with "stream": true it is sent as
// server-sent events, one chat.completion.chunk per token, a last chunk
// with the usage if stream_options.include_usage, then data: [DONE]. A body
// that is not a chat request answers 400, another method 405, and neither
// is counted against the limits.
//
// POST to any path that ends in /v1/messages (Server.AnthropicURL +
// "/v1/messages") is an Anthropic Messages API request: model, max_tokens
// (both required), system and messages (strings or content blocks, see
// Content), tools and stream are read. It is counted by Anthropic's rules:
// 1 request; its input tokens (MessageInputTokens: characters/4 of the
// system prompt, messages and tools, plus 3 a message), taken at
// admission; and its max_tokens in output tokens, taken at admission, the
// part the completion does not use given back once the response is
// written (or abandoned), as Anthropic says it estimates output tokens
// from max_tokens at the start of a request and adjusts them at its end.
// A request is admitted only if every limit has room for its whole
// charge. The Tokens limit, if set, counts the input plus the output (its
// cap, with ChargeCap). The reply is min(max_tokens, ReplyTokens) tokens of
// lorem ipsum (stop_reason "max_tokens" if max_tokens cut it short, else
// "end_turn") as a Message with its usage {input_tokens, output_tokens};
// with "stream": true as Anthropic's server-sent events: message_start
// (usage: the input tokens, and 1 output token), content_block_start,
// ping, one content_block_delta per token, content_block_stop,
// message_delta (the stop reason, and usage: the output tokens),
// message_stop. Beyond the limits it answers 429 with Anthropic's error
// body (type rate_limit_error) and Retry-After in whole seconds, rounded
// up (see Config.RetryAfter); errors, 400 and 405, have Anthropic's body
// too. With AnthropicHeaders, every response the limits decided reports
// requests, input tokens, output tokens and tokens, the last the most
// restrictive of the token limits.
//
// Any other path and method answers 200 "ok" for 1 request and 0 tokens:
// an API that rate-limits plain HTTP calls.
//
// Beyond the limits the answer is 429 with an OpenAI error body ("type" is
// the dimension that refused, "code" rate_limit_exceeded) and Retry-After:
// the time until the request would fit, in seconds rounded up (see
// Config.RetryAfter), or with Config.Gemini, Gemini's body and no header.
// A request larger than a limit's capacity can never fit: it answers 429
// "Request too large" without Retry-After.
//
// A Handler is safe for concurrent use. It keeps every admission until
// Reset, for MaxInWindow and Series.
type Handler struct {
	cfg Config
	now func() time.Time

	mu       sync.Mutex
	last     int64 // latest clock reading, Unix nanoseconds
	start    int64 // of Series: creation or last Reset
	resets   int64 // Resets so far: a give-back from before one is void
	meters   [numDims]meter
	stats    Stats
	admitted []charge // what each admission was charged
	rejected []int64  // times of the limits' 429s
	seq      int64    // numbers completions
}

// NewHandler returns a Handler configured by cfg, its limits full at the
// time cfg.Now reads. It panics if cfg.ReplyTokens is negative.
func NewHandler(cfg Config) *Handler {
	if cfg.ReplyTokens < 0 {
		panic(fmt.Sprintf("llmtest: ReplyTokens is %d, want >= 0", cfg.ReplyTokens))
	}
	if cfg.ReplyTokens == 0 {
		cfg.ReplyTokens = 16
	}
	h := &Handler{cfg: cfg, now: cfg.Now}
	if h.now == nil {
		h.now = time.Now
	}
	h.Reset()
	return h
}

// Server is a Handler served over HTTP on a loopback address.
type Server struct {
	*Handler
	// URL is the base URL of the API, http://127.0.0.1:port/v1: what
	// OpenAI clients take as their base URL.
	URL string
	// AnthropicURL is http://127.0.0.1:port, what Anthropic clients take
	// as their base URL: they add /v1/messages.
	AnthropicURL string

	srv *httptest.Server
}

// NewServer starts and returns a Server with a NewHandler(cfg); the caller
// should Close it when done.
func NewServer(cfg Config) *Server {
	h := NewHandler(cfg)
	srv := httptest.NewServer(h)
	return &Server{Handler: h, URL: srv.URL + "/v1", AnthropicURL: srv.URL, srv: srv}
}

// Close shuts the server down, blocking until every request to it is done.
func (s *Server) Close() { s.srv.Close() }

// Reset forgets every admission and counter and fills the limits, at the
// time the clock reads.
func (h *Handler) Reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.tick()
	h.start = now
	for d, l := range h.limits() {
		h.meters[d] = l.newMeter(now)
	}
	h.stats = Stats{}
	h.admitted, h.rejected = nil, nil
	h.resets++
}

// tick reads the clock, never earlier than its last reading. h.mu is held.
func (h *Handler) tick() int64 {
	h.last = max(h.last, h.now().UnixNano())
	return h.last
}

// maxBody caps the size of a chat request's body.
const maxBody = 8 << 20

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, messagesPath) {
		h.serveMessages(w, r)
		return
	}
	if h.cfg.Fault != nil {
		if f := h.cfg.Fault(h.now()); f != NoFault {
			h.count(&h.stats.Faulted)
			writeFault(w, f)
			return
		}
	}
	if !strings.HasSuffix(r.URL.Path, "/chat/completions") {
		h.serve(w, r, nil)
		return
	}
	if r.Method != http.MethodPost {
		h.count(&h.stats.Invalid)
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
			"Method "+r.Method+" not allowed; use POST.")
		return
	}
	var req ChatRequest
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&req)
	if err == nil {
		err = req.validate()
	}
	if err != nil {
		h.count(&h.stats.Invalid)
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "Invalid request: "+err.Error())
		return
	}
	h.serve(w, r, &req)
}

// count adds one to a counter of h.stats.
func (h *Handler) count(c *int64) {
	h.mu.Lock()
	*c++
	h.mu.Unlock()
}

// serve answers r, a chat completion req or, if req is nil, a plain call.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, req *ChatRequest) {
	var a *answer
	cost := [numDims]int64{Requests: 1}
	if req != nil {
		a = &answer{id: "chatcmpl-llmtest-", model: req.Model, prompt: PromptTokens(*req), completion: h.cfg.ReplyTokens, finish: "stop"}
		limit := req.maxCompletion()
		if limit == 0 {
			limit = h.cfg.ReplyTokens
		} else if limit < a.completion {
			a.completion, a.finish = limit, "length"
		}
		cost = h.cost(a, limit)
	}
	d := h.admit(cost, a)
	h.cfg.Headers.write(w.Header(), &d.quotas, d.now)
	switch {
	case !d.refused:
	case h.cfg.Gemini:
		model := ""
		if req != nil {
			model = req.Model
		}
		writeGemini(w, &d, model)
		return
	case d.wait == 0:
		q := d.quotas[d.dim]
		writeError(w, http.StatusTooManyRequests, d.dim.String(), "rate_limit_exceeded", fmt.Sprintf(
			"Request too large for %s (%v): Limit %d, Requested %d.", d.dim, q.limit, q.limit.capacity(), cost[d.dim]))
		return
	default:
		q := d.quotas[d.dim]
		h.setRetryAfter(w.Header(), d.wait)
		writeError(w, http.StatusTooManyRequests, d.dim.String(), "rate_limit_exceeded", fmt.Sprintf(
			"Rate limit reached for %s (%v): Limit %d, Remaining %d, Requested %d. Please try again in %s.",
			d.dim, q.limit, q.limit.capacity(), q.remaining, cost[d.dim], openAIDuration(d.wait)))
		return
	}
	switch {
	case a == nil:
		if sleep(r, h.cfg.Latency) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			io.WriteString(w, "ok")
		}
	case req.Stream:
		a.writeStream(w, r, h.cfg.Latency, h.cfg.TokenLatency, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
	default:
		a.writeJSON(w, r, h.cfg.Latency, h.cfg.TokenLatency)
	}
	if a != nil {
		h.giveBack(&d, cost[OutputTokens]-int64(a.completion))
	}
}

// cost returns what completion a, capped at limit tokens, costs. A cap
// beyond 2^31-1 counts as 2^31-1, so that no sum of costs overflows.
func (h *Handler) cost(a *answer, limit int) [numDims]int64 {
	l := int64(min(limit, math.MaxInt32))
	c := [numDims]int64{Requests: 1, Tokens: int64(a.prompt + a.completion),
		InputTokens: int64(a.prompt), OutputTokens: l}
	if h.cfg.ChargeCap {
		c[Tokens] = int64(a.prompt) + l
	}
	return c
}

// giveBack gives n output tokens back to the limit that d admitted, at the
// end of the response: the part of its cap the completion did not use.
func (h *Handler) giveBack(d *decision, n int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if d.refused || n <= 0 || d.resets != h.resets {
		return
	}
	now := h.tick()
	if m := h.meters[OutputTokens]; m != nil {
		m.give(now, d.now.UnixNano(), n)
	}
	h.admitted[d.admission].cost[OutputTokens] -= n
}

// setRetryAfter sets the Retry-After (and retry-after-ms) of a 429 whose
// request would fit after wait, as Config.RetryAfter says.
func (h *Handler) setRetryAfter(hdr http.Header, wait time.Duration) {
	switch ra := h.cfg.RetryAfter; {
	case ra == 0:
		setRetryAfter(hdr, wait, h.cfg.RetryAfterMs)
	case ra > 0:
		setRetryAfter(hdr, ra, h.cfg.RetryAfterMs)
	}
}

// decision is the limits' verdict on one request.
type decision struct {
	now    time.Time
	quotas [numDims]*quota // after the decision; nil if unlimited
	// If admitted, admission is its index in Handler.admitted, made
	// between the Resets-th Reset and the next.
	admission int
	resets    int64
	// If refused, dim is the dimension that decided it (the first that
	// can never fit the cost, else the one that fits it last), and wait
	// how long until the request fits, zero if it never will.
	refused  bool
	refusing [numDims]bool // the dimensions that refused it
	dim      Dimension
	wait     time.Duration
}

// admit decides on a request of cost, admitting it if every limit has room,
// and counts it; a, the completion if it is one, gets its id and time.
func (h *Handler) admit(cost [numDims]int64, a *answer) decision {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.tick()
	d := decision{now: time.Unix(0, now)}
	h.markRefusing(&d, now, cost)
	if d.refused {
		h.refuse(&d, now, cost)
	} else {
		h.accept(&d, now, cost, a)
	}
	d.quotas = h.quotas(now)
	return d
}

// markRefusing marks in d the limits that have no room for cost at now,
// and counts each refusal by its dimension. h.mu must be held.
func (h *Handler) markRefusing(d *decision, now int64, cost [numDims]int64) {
	for i, m := range h.meters {
		if m == nil {
			continue
		}
		if wait, ok := m.wait(now, cost[i]); !ok || wait > 0 {
			d.refusing[i], d.refused = true, true
			h.stats.RejectedBy[i]++
		}
	}
}

// refuse counts d, a refusal of cost at now, and tells the limits that
// count refusals; then it sets d's wait and the dimension it names.
// h.mu must be held.
func (h *Handler) refuse(d *decision, now int64, cost [numDims]int64) {
	h.stats.Rejected++
	h.rejected = append(h.rejected, now)
	// The limits that count refusals count this one, then the waits are
	// read: a retry is counted against what it waited for.
	for i, m := range h.meters {
		if m != nil {
			m.refuse(now, cost[i])
		}
	}
	h.nameRefusal(d, now, cost)
}

// nameRefusal sets d's wait, until the refused cost fits every limit, and
// the dimension it names: the first refusing one that never fits it (with
// no wait), else the refusing one that fits it last. h.mu must be held.
func (h *Handler) nameRefusal(d *decision, now int64, cost [numDims]int64) {
	named := false
	var longest time.Duration
	for i, m := range h.meters {
		if m == nil {
			continue
		}
		wait, ok := m.wait(now, cost[i])
		switch {
		case !ok:
			d.dim, d.wait = Dimension(i), 0
			return
		case d.refusing[i] && (!named || wait > longest):
			d.dim, longest, named = Dimension(i), wait, true
		}
		d.wait = max(d.wait, wait)
	}
}

// accept takes cost from every limit at now, records the admission in d
// and counts it; a, the completion if it is one, gets its id and time,
// and its tokens are counted. h.mu must be held.
func (h *Handler) accept(d *decision, now int64, cost [numDims]int64, a *answer) {
	for i, m := range h.meters {
		if m != nil {
			m.take(now, cost[i])
		}
	}
	h.stats.Accepted++
	h.stats.ChargedTokens += cost[Tokens]
	d.admission, d.resets = len(h.admitted), h.resets
	h.admitted = append(h.admitted, charge{now, cost})
	if a == nil {
		return
	}
	h.seq++
	a.id, a.created = a.id+strconv.FormatInt(h.seq, 10), now/int64(time.Second)
	h.stats.PromptTokens += int64(a.prompt)
	h.stats.CompletionTokens += int64(a.completion)
	h.stats.TotalTokens += int64(a.prompt + a.completion)
}

// quotas returns each limit's quota at now, nil where there is no limit.
// h.mu must be held.
func (h *Handler) quotas(now int64) [numDims]*quota {
	var qs [numDims]*quota
	limits := h.limits()
	for i, m := range h.meters {
		if m != nil {
			q := &quota{limit: limits[i]}
			q.remaining, q.reset = m.status(now)
			qs[i] = q
		}
	}
	return qs
}

// limits returns the configured limits by Dimension.
func (h *Handler) limits() [numDims]Limit {
	return [numDims]Limit{h.cfg.Requests, h.cfg.Tokens, h.cfg.InputTokens, h.cfg.OutputTokens}
}

// errorJSON is OpenAI's error body.
type errorJSON struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// writeError answers an OpenAI error; an empty code is null.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	var e errorJSON
	e.Error.Message, e.Error.Type = msg, typ
	if code != "" {
		e.Error.Code = &code
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(e)
}

// writeFault answers f.
func writeFault(w http.ResponseWriter, f Fault) {
	switch f {
	case Overloaded:
		writeError(w, 529, "overloaded_error", "", "Overloaded")
	case Unavailable:
		writeError(w, http.StatusServiceUnavailable, "server_error", "",
			"The server is overloaded or not ready yet.")
	case QuotaExhausted:
		writeError(w, http.StatusTooManyRequests, "insufficient_quota", "insufficient_quota",
			"You exceeded your current quota, please check your plan and billing details.")
	default:
		writeError(w, http.StatusInternalServerError, "server_error", "", fmt.Sprintf("llmtest: unknown Fault(%d)", f))
	}
}
