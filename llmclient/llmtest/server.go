package llmtest

import (
	"encoding/json"
	"fmt"
	"io"
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
// a value not named here answers 500.
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
// of two endpoints.
//
// POST to any path that ends in /chat/completions (Server.URL +
// "/chat/completions") is an OpenAI chat completion. The request costs 1
// request and its usage in tokens (PromptTokens + the completion's length),
// taken at admission; with Config.ChargeCap, PromptTokens + its cap. The
// completion is min(cap, ReplyTokens) tokens of
// lorem ipsum, 4 characters a token (finish_reason "length" if the cap cut
// it short, else "stop"), with its usage; with "stream": true it is sent as
// server-sent events, one chat.completion.chunk per token, a last chunk
// with the usage if stream_options.include_usage, then data: [DONE]. A body
// that is not a chat request answers 400, another method 405, and neither
// is counted against the limits.
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
	meters   [numDims]meter
	stats    Stats
	admitted []admission // tokens charged by each admission
	rejected []int64     // times of the limits' 429s
	seq      int64       // numbers completions
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

	srv *httptest.Server
}

// NewServer starts and returns a Server with a NewHandler(cfg); the caller
// should Close it when done.
func NewServer(cfg Config) *Server {
	h := NewHandler(cfg)
	srv := httptest.NewServer(h)
	return &Server{Handler: h, URL: srv.URL + "/v1", srv: srv}
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
		a = &answer{model: req.Model, prompt: PromptTokens(*req), completion: h.cfg.ReplyTokens, finish: "stop"}
		limit := req.maxCompletion()
		if limit == 0 {
			limit = h.cfg.ReplyTokens
		} else if limit < a.completion {
			a.completion, a.finish = limit, "length"
		}
		cost[Tokens] = int64(a.prompt + a.completion)
		if h.cfg.ChargeCap {
			cost[Tokens] = int64(a.prompt + limit)
		}
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
		switch ra := h.cfg.RetryAfter; {
		case ra == 0:
			setRetryAfter(w.Header(), d.wait, h.cfg.RetryAfterMs)
		case ra > 0:
			setRetryAfter(w.Header(), ra, h.cfg.RetryAfterMs)
		}
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
}

// decision is the limits' verdict on one request.
type decision struct {
	now    time.Time
	quotas [numDims]*quota // after the decision; nil if unlimited
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
	refusing := &d.refusing
	for i, m := range h.meters {
		if m == nil {
			continue
		}
		if wait, ok := m.wait(now, cost[i]); !ok || wait > 0 {
			refusing[i], d.refused = true, true
			h.stats.RejectedBy[i]++
		}
	}
	if d.refused {
		h.stats.Rejected++
		h.rejected = append(h.rejected, now)
		// The limits that count refusals count this one, then the waits
		// are read: a retry is counted against what it waited for.
		for i, m := range h.meters {
			if m != nil {
				m.refuse(now, cost[i])
			}
		}
		// The wait is until the request fits every limit; the dimension
		// named is the first refusing one that never fits it, else the
		// refusing one that fits it last.
		never, named := false, false
		var longest time.Duration
		for i, m := range h.meters {
			if m == nil || never {
				continue
			}
			wait, ok := m.wait(now, cost[i])
			switch {
			case !ok:
				d.dim, d.wait, never = Dimension(i), 0, true
				continue
			case refusing[i] && (!named || wait > longest):
				d.dim, longest, named = Dimension(i), wait, true
			}
			d.wait = max(d.wait, wait)
		}
	} else {
		for i, m := range h.meters {
			if m != nil {
				m.take(now, cost[i])
			}
		}
		h.stats.Accepted++
		h.stats.ChargedTokens += cost[Tokens]
		h.admitted = append(h.admitted, admission{now, cost[Tokens]})
		if a != nil {
			h.seq++
			a.id, a.created = "chatcmpl-llmtest-"+strconv.FormatInt(h.seq, 10), now/int64(time.Second)
			h.stats.PromptTokens += int64(a.prompt)
			h.stats.CompletionTokens += int64(a.completion)
			h.stats.TotalTokens += int64(a.prompt + a.completion)
		}
	}
	limits := h.limits()
	for i, m := range h.meters {
		if m != nil {
			q := &quota{limit: limits[i]}
			q.remaining, q.reset = m.status(now)
			d.quotas[i] = q
		}
	}
	return d
}

// limits returns the configured limits by Dimension.
func (h *Handler) limits() [numDims]Limit { return [numDims]Limit{h.cfg.Requests, h.cfg.Tokens} }

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
