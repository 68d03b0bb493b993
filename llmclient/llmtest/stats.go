package llmtest

import "time"

// Stats counts what a Handler answered since it was made or last Reset.
// Accepted + Rejected + Faulted + Invalid is every request answered.
type Stats struct {
	Accepted int64 // requests the limits admitted
	Rejected int64 // requests the limits answered 429
	// RejectedBy counts rejections by the Dimension that refused them
	// (its index); a request that several refused counts in each.
	RejectedBy [4]int64
	Faulted    int64 // requests that Config.Fault answered
	Invalid    int64 // chat requests answered 400 or 405
	// ChargedTokens is what the accepted requests cost in tokens at
	// admission (prompt plus cap): what the token limit counted.
	ChargedTokens int64
	// PromptTokens, CompletionTokens and TotalTokens sum the usage that
	// the accepted chat completions and messages report (a message's
	// input_tokens, output_tokens and their sum), counted at admission.
	PromptTokens, CompletionTokens, TotalTokens int64
}

// Stats returns the counters of h.
func (h *Handler) Stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

// MaxInWindow returns the most the limits admitted in any interval
// [t, t+w) since h was made or last Reset, exactly, by the clock: requests,
// or tokens charged at admission; output tokens as they stay charged once
// the unused part of each cap is given back, counted at admission. It is
// the figure to hold against a limit: a SlidingWindow(n, w) or
// CountingSlidingWindow(n, w) keeps it at most n, a FixedWindow(n, w) or a
// TokenBucket(n, w, n) at most 2n, a LeakyBucket(n, w, n) at most 2n+1
// (for output tokens, plus what is given back within the interval of caps
// taken before it). It is 0 if w <= 0 or d is no Dimension.
func (h *Handler) MaxInWindow(d Dimension, w time.Duration) int64 {
	if w <= 0 || d >= numDims {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var most, sum int64
	i := 0 // the oldest admission in the window that ends with the current one
	for _, a := range h.admitted {
		sum += a.cost[d]
		for ; a.t-h.admitted[i].t >= int64(w); i++ {
			sum -= h.admitted[i].cost[d]
		}
		most = max(most, sum)
	}
	return most
}

// Point is what the limits decided in one interval of a Series.
type Point struct {
	Start    time.Time // in UTC; the interval is [Start, Start+width)
	Requests int64     // requests admitted
	Tokens   int64     // tokens charged at their admission
	Rejected int64     // requests answered 429
}

// Series returns what the limits decided in consecutive intervals of width
// d, from h's creation or last Reset up to its last admission or
// rejection, by the clock: the data of a chart, whose limit line is
// Limit.Rate()·d.Seconds() per interval. It returns nil if there is no
// decision, and panics if d <= 0.
func (h *Handler) Series(d time.Duration) []Point {
	if d <= 0 {
		panic("llmtest: Series with a width <= 0")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.admitted)+len(h.rejected) == 0 {
		return nil
	}
	last := h.start
	if n := len(h.admitted); n > 0 {
		last = h.admitted[n-1].t
	}
	if n := len(h.rejected); n > 0 {
		last = max(last, h.rejected[n-1])
	}
	w := int64(d)
	pts := make([]Point, (last-h.start)/w+1)
	for i := range pts {
		pts[i].Start = time.Unix(0, h.start+int64(i)*w).UTC()
	}
	for _, a := range h.admitted {
		p := &pts[(a.t-h.start)/w]
		p.Requests++
		p.Tokens += a.cost[Tokens]
	}
	for _, t := range h.rejected {
		pts[(t-h.start)/w].Rejected++
	}
	return pts
}

// charge is what an admission at t (Unix nanoseconds) was charged, by
// Dimension; its output tokens less what was given back.
type charge struct {
	t    int64
	cost [numDims]int64
}

// Stats.RejectedBy has an entry for every Dimension.
var _ [numDims]int64 = Stats{}.RejectedBy
