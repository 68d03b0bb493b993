package llmtest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// step advances the clock, then sends one plain request per wanted answer:
// 0 for 200, else the exact wait a 429 reports in retry-after-ms.
type step struct {
	advance time.Duration
	want    []time.Duration
}

// pass is the answer of an admitted request in a step.
const pass = time.Duration(0)

func TestAlgorithmBoundaries(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name  string
		limit Limit
		start time.Duration // clock offset from a whole second
		steps []step
	}{{
		name:  "token bucket refills one per 100ms up to its burst",
		limit: TokenBucket(10, time.Second, 3),
		steps: []step{
			{0, []time.Duration{pass, pass, pass, 100 * ms}},
			{99 * ms, []time.Duration{1 * ms}},
			{1 * ms, []time.Duration{pass, 100 * ms}},
			{250 * ms, []time.Duration{pass, pass, 50 * ms}},
			{time.Hour, []time.Duration{pass, pass, pass, 100 * ms}},
		},
	}, {
		name:  "token bucket of a fractional rate per second",
		limit: TokenBucket(7, time.Second, 1), // one per 142857142.857… ns
		steps: []step{
			{0, []time.Duration{pass, 142857143}},
			{142857142, []time.Duration{1}},
			{1, []time.Duration{pass, 142857143}},
		},
	}, {
		name:  "fixed window resets at the aligned boundary",
		limit: FixedWindow(3, time.Second),
		start: 500 * ms,
		steps: []step{
			{0, []time.Duration{pass, pass, pass, 500 * ms}},
			{499 * ms, []time.Duration{1 * ms}},
			{1 * ms, []time.Duration{pass, pass, pass, time.Second}},
			{999*ms + 999999, []time.Duration{1}},
			{1, []time.Duration{pass}},
		},
	}, {
		name:  "sliding window admits n in any window",
		limit: SlidingWindow(3, time.Second),
		start: 500 * ms,
		steps: []step{
			{0, []time.Duration{pass}},
			{400 * ms, []time.Duration{pass, pass}},
			{100 * ms, []time.Duration{500 * ms}},
			{499 * ms, []time.Duration{1 * ms}},
			{1 * ms, []time.Duration{pass, 400 * ms}}, // the first one expired
			{400 * ms, []time.Duration{pass, pass, 600 * ms}},
		},
	}, {
		name:  "leaky bucket admits burst+1 at once, then drains one per 100ms",
		limit: LeakyBucket(10, time.Second, 3),
		steps: []step{
			{0, []time.Duration{pass, pass, pass, pass, 100 * ms}},
			{99 * ms, []time.Duration{1 * ms}}, // refusals change nothing
			{1 * ms, []time.Duration{pass, 100 * ms}},
			{250 * ms, []time.Duration{pass, pass, 50 * ms}},
			{time.Hour, []time.Duration{pass, pass, pass, pass, 100 * ms}},
		},
	}, {
		name:  "nginx's rate=20r/s burst=20 nodelay: 21 at once, then one per 50ms",
		limit: LeakyBucket(20, time.Second, 20),
		steps: []step{
			{0, append(passes(21), 50*ms)},
			{50 * ms, []time.Duration{pass, 50 * ms}},
			{25 * ms, []time.Duration{25 * ms}},
			{1025 * ms, append(passes(21), 50*ms)}, // drained 1.05 s after the last admission
		},
	}, {
		name:  "leaky bucket without burst",
		limit: LeakyBucket(10, time.Second, 0),
		steps: []step{
			{0, []time.Duration{pass, 100 * ms}},
			{100 * ms, []time.Duration{pass, 100 * ms}},
		},
	}, {
		name:  "counting sliding window counts refusals: a steady retry stream stays out",
		limit: CountingSlidingWindow(3, time.Second),
		steps: []step{
			{0, []time.Duration{pass, pass, pass}},
			// Each refusal counts and says when the request, counted with
			// it, fits.
			{250 * ms, []time.Duration{750 * ms}},
			{250 * ms, []time.Duration{500 * ms}},
			{250 * ms, []time.Duration{500 * ms}},
			{250 * ms, []time.Duration{500 * ms}}, // the first three expired; a SlidingWindow admits
			{250 * ms, []time.Duration{500 * ms}},
			{250 * ms, []time.Duration{500 * ms}},
			// Waiting as told: the window holds the refusals at 1.25 and
			// 1.5 s, and room for one.
			{500 * ms, []time.Duration{pass, 500 * ms}},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			clk.Advance(tc.start)
			h := NewHandler(Config{Requests: tc.limit, RetryAfterMs: true, Now: clk.Now})
			for i, s := range tc.steps {
				clk.Advance(s.advance)
				for j, want := range s.want {
					w := get(h)
					name := fmt.Sprintf("step %d, request %d", i, j)
					if want == pass {
						assert.Equal(t, http.StatusOK, w.Code, name)
						continue
					}
					require.Equal(t, http.StatusTooManyRequests, w.Code, name)
					millis := int64((want + time.Millisecond - 1) / time.Millisecond)
					assert.Equal(t, fmt.Sprint(millis), w.Header().Get("Retry-After-Ms"), name)
					wait, ok := h.meters[Requests].wait(clk.Now().UnixNano(), 1)
					assert.True(t, ok)
					assert.Equal(t, want, wait, name)
				}
			}
		})
	}
}

func TestAllDimensionsMustAdmit(t *testing.T) {
	clk := newClock()
	h := NewHandler(Config{ChargeCap: true,
		Requests: FixedWindow(3, time.Minute),
		Tokens:   FixedWindow(100, time.Minute),
		Now:      clk.Now,
	})
	// "abcd" is 1 + 3 prompt tokens; with max_tokens 46 the cost is 50.
	require.Equal(t, http.StatusOK, chat(t, h, userMessage("abcd", 46)).Code)
	require.Equal(t, http.StatusOK, chat(t, h, userMessage("abcd", 46)).Code)

	w := chat(t, h, userMessage("abcd", 1)) // 5 tokens: none left
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	e := apiError(t, w)
	assert.Equal(t, "tokens", e.Error.Type)
	assert.Equal(t, "rate_limit_exceeded", *e.Error.Code)
	assert.Contains(t, e.Error.Message, "Limit 100, Remaining 0, Requested 5")

	assert.Equal(t, http.StatusOK, get(h).Code, "a plain call costs no tokens")
	w = get(h)
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "requests", apiError(t, w).Error.Type)

	clk.Advance(time.Minute)
	w = chat(t, h, userMessage("abcd", 96)) // 100 tokens
	assert.Equal(t, http.StatusOK, w.Code)

	st := h.Stats()
	assert.EqualValues(t, 4, st.Accepted)
	assert.EqualValues(t, 2, st.Rejected)
	assert.Equal(t, [4]int64{1, 1}, st.RejectedBy)
	assert.EqualValues(t, 200, st.ChargedTokens)
}

func TestRefusedByBothNamesTheLongerWait(t *testing.T) {
	clk := newClock()
	h := NewHandler(Config{ChargeCap: true,
		Requests: TokenBucket(1, time.Second, 1),
		Tokens:   TokenBucket(10, time.Second, 20),
		Now:      clk.Now,
	})
	require.Equal(t, http.StatusOK, chat(t, h, userMessage("", 17)).Code) // 3+17 tokens
	w := chat(t, h, userMessage("", 7))
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "requests", apiError(t, w).Error.Type, "1 s for a request, 1 s for 10 tokens: the first wins a tie")
	w = chat(t, h, userMessage("", 8))
	assert.Equal(t, "tokens", apiError(t, w).Error.Type, "1.1 s for 11 tokens")
	assert.Equal(t, [4]int64{2, 2}, h.Stats().RejectedBy)
}

func TestRequestTooLarge(t *testing.T) {
	h := NewHandler(Config{ChargeCap: true, Tokens: SlidingWindow(100, time.Minute), Headers: OpenAIHeaders, Now: newClock().Now})
	w := chat(t, h, userMessage("", 98)) // 101 tokens
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Empty(t, w.Header().Get("Retry-After"), "waiting will not help")
	assert.Equal(t, "100", w.Header().Get("X-Ratelimit-Remaining-Tokens"))
	e := apiError(t, w)
	assert.Equal(t, "tokens", e.Error.Type)
	assert.Equal(t, "Request too large for tokens (sliding window 100 per 1m0s): Limit 100, Requested 101.", e.Error.Message)
	assert.Equal(t, http.StatusOK, chat(t, h, userMessage("", 97)).Code)
}

func TestClockNeverRunsBackwards(t *testing.T) {
	clk := newClock()
	h := NewHandler(Config{Requests: SlidingWindow(1, time.Second), Now: clk.Now})
	clk.Advance(time.Second)
	require.Equal(t, http.StatusOK, get(h).Code)
	clk.Advance(-time.Second)
	assert.Equal(t, http.StatusTooManyRequests, get(h).Code)
	clk.Advance(2 * time.Second)
	assert.Equal(t, http.StatusOK, get(h).Code, "a second after the latest reading")
}

func TestLimitConstructorsPanic(t *testing.T) {
	for name, f := range map[string]func(){
		"token bucket n":            func() { TokenBucket(0, time.Second, 1) },
		"token bucket period":       func() { TokenBucket(1, 0, 1) },
		"token bucket burst":        func() { TokenBucket(1, time.Second, -1) },
		"token bucket beyond int64": func() { TokenBucket(7, time.Hour, math.MaxInt64/1000) },
		"fixed window n":            func() { FixedWindow(0, time.Second) },
		"fixed window window":       func() { FixedWindow(1, -time.Second) },
		"sliding window n":          func() { SlidingWindow(-1, time.Second) },
		"sliding window window":     func() { SlidingWindow(1, 0) },
		"counting window n":         func() { CountingSlidingWindow(0, time.Second) },
		"counting window window":    func() { CountingSlidingWindow(1, -1) },
		"leaky bucket n":            func() { LeakyBucket(0, time.Second, 1) },
		"leaky bucket period":       func() { LeakyBucket(1, 0, 1) },
		"leaky bucket burst":        func() { LeakyBucket(1, time.Second, -1) },
		"leaky bucket beyond int64": func() { LeakyBucket(7, time.Hour, math.MaxInt64/1000) },
		"leaky bucket largest":      func() { LeakyBucket(1, 1, math.MaxInt64) },
		"negative reply tokens":     func() { NewHandler(Config{ReplyTokens: -1}) },
		"series of width zero":      func() { NewHandler(Config{}).Series(0) },
		"token bucket coprime":      func() { TokenBucket(7, 24*time.Hour, 1e9) },
	} {
		assert.Panics(t, f, name)
	}
	// Large limits that reduce well are fine: 10^9 tokens a day, in full.
	assert.NotPanics(t, func() { TokenBucket(1e9, 24*time.Hour, 1e9) })
}

func TestLimitStringAndRate(t *testing.T) {
	for _, tc := range []struct {
		l    Limit
		s    string
		rate float64
	}{
		{Limit{}, "unlimited", 0},
		{TokenBucket(500, time.Minute, 100), "token bucket 500 per 1m0s, burst 100", 500.0 / 60},
		{FixedWindow(20, time.Second), "fixed window 20 per 1s", 20},
		{SlidingWindow(30, 2*time.Second), "sliding window 30 per 2s", 15},
		{CountingSlidingWindow(20, time.Second), "counting sliding window 20 per 1s", 20},
		{LeakyBucket(20, time.Second, 20), "leaky bucket 20 per 1s, burst 20", 20},
	} {
		assert.Equal(t, tc.s, tc.l.String())
		assert.InDelta(t, tc.rate, tc.l.Rate(), 1e-12, tc.s)
	}
	assert.Equal(t, "requests", Requests.String())
	assert.Equal(t, "tokens", Tokens.String())
	assert.Equal(t, "Dimension(7)", Dimension(7).String())
}

// TestTokensChargedAsUsed: by default a chat costs the tokens it reports
// using, not its cap; with ChargeCap, its cap.
func TestTokensChargedAsUsed(t *testing.T) {
	for _, tc := range []struct {
		chargeCap bool
		want      int64
	}{{false, 3 + 10}, {true, 3 + 500}} {
		h := NewHandler(Config{ChargeCap: tc.chargeCap, ReplyTokens: 10, Tokens: TokenBucket(1000, time.Minute, 1000), Now: newClock().Now})
		w := chat(t, h, userMessage("", 500)) // empty prompt: 3 tokens
		require.Equal(t, http.StatusOK, w.Code)
		s := h.Stats()
		assert.Equal(t, tc.want, s.ChargedTokens, "ChargeCap %v", tc.chargeCap)
		assert.Equal(t, int64(13), s.TotalTokens, "the usage reported")
	}
}

// passes returns n admitted answers of a step.
func passes(n int) []time.Duration { return make([]time.Duration, n) }

// arrivals returns the times, from 0, of a client that mostly sends faster
// than 20 per second in bursts and now and then pauses long enough for a
// 1 s window to drain: gaps of 0 to 60 ms, and one in 50 of 1 to 1.5 s, in
// whole milliseconds.
func arrivals(seed uint64, n int) []time.Duration {
	r := rand.New(rand.NewPCG(seed, 1))
	ts := make([]time.Duration, n)
	var t time.Duration
	for i := range ts {
		gap := time.Duration(r.IntN(61)) * time.Millisecond
		if r.IntN(50) == 0 {
			gap = time.Duration(1000+r.IntN(501)) * time.Millisecond
		}
		t += gap
		ts[i] = t
	}
	return ts
}

// TestCountingSlidingWindowIsAnExactLog holds the handler's answers
// against the definition, counted by brute force: a request is admitted
// iff the requests before it in the window that ends with it, admitted or
// refused, number fewer than n.
func TestCountingSlidingWindowIsAnExactLog(t *testing.T) {
	const n, w = 20, time.Second
	for seed := range uint64(5) {
		clk := newClock()
		h := NewHandler(Config{Requests: CountingSlidingWindow(n, w), Now: clk.Now})
		ts := arrivals(seed, 2000)
		admitted := 0
		for i, at := range ts {
			clk.Advance(at - clk.Now().Sub(epoch))
			before := 0
			for j := i - 1; j >= 0 && ts[j] > at-w; j-- {
				before++
			}
			want := http.StatusTooManyRequests
			if before < n {
				want = http.StatusOK
				admitted++
			}
			require.Equal(t, want, get(h).Code, "seed %d, request %d at %v, %d before it in the window", seed, i, at, before)
		}
		assert.LessOrEqual(t, h.MaxInWindow(Requests, w), int64(n))
		assert.EqualValues(t, admitted, h.Stats().Accepted)
		t.Logf("seed %d: %d of %d admitted in %v", seed, admitted, len(ts), ts[len(ts)-1])
	}
}

// TestCountingSlidingWindowKeepsARetryStreamOut: a client that sends 40
// per second into 20 per second gets its first 20 and then nothing for as
// long as it keeps sending; a SlidingWindow, which forgets refusals,
// admits 20 of every second.
func TestCountingSlidingWindowKeepsARetryStreamOut(t *testing.T) {
	for _, tc := range []struct {
		limit Limit
		want  int64
	}{
		{CountingSlidingWindow(20, time.Second), 20},
		{SlidingWindow(20, time.Second), 100},
	} {
		clk := newClock()
		h := NewHandler(Config{Requests: tc.limit, Now: clk.Now})
		for range 200 { // 5 s
			get(h)
			clk.Advance(25 * time.Millisecond)
		}
		assert.Equal(t, tc.want, h.Stats().Accepted, "%v", tc.limit)
	}
	// Once the stream pauses for a window, the counting window is whole.
	clk := newClock()
	h := NewHandler(Config{Requests: CountingSlidingWindow(20, time.Second), Now: clk.Now})
	for range 200 {
		get(h)
		clk.Advance(25 * time.Millisecond)
	}
	clk.Advance(time.Second - 25*time.Millisecond)
	for range 20 {
		assert.Equal(t, http.StatusOK, get(h).Code)
	}
	assert.Equal(t, http.StatusTooManyRequests, get(h).Code)
}

// TestCountingSlidingWindowCountsWhatAnotherLimitRefuses: a request the
// token limit refuses still counts against the counting request window;
// one too large to ever fit a counting window does not count in it.
func TestCountingSlidingWindowCountsWhatAnotherLimitRefuses(t *testing.T) {
	clk := newClock()
	h := NewHandler(Config{ChargeCap: true, Headers: OpenAIHeaders, Now: clk.Now,
		Requests: CountingSlidingWindow(5, time.Second),
		Tokens:   CountingSlidingWindow(100, time.Minute),
	})
	require.Equal(t, http.StatusOK, chat(t, h, userMessage("", 97)).Code) // 100 tokens
	w := chat(t, h, userMessage("", 1))                                   // 4 tokens: none left
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "tokens", apiError(t, w).Error.Type)
	assert.Equal(t, "3", w.Header().Get("X-Ratelimit-Remaining-Requests"), "the refusal counts")
	assert.Equal(t, "0", w.Header().Get("X-Ratelimit-Remaining-Tokens"))
	assert.Equal(t, "60", w.Header().Get("Retry-After"), "the tokens fit when the first request expires")

	clk.Advance(time.Minute)
	w = chat(t, h, userMessage("", 98)) // 101 tokens: never fits
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Empty(t, w.Header().Get("Retry-After"))
	assert.Equal(t, "100", w.Header().Get("X-Ratelimit-Remaining-Tokens"), "too large: not counted")
	assert.Equal(t, "4", w.Header().Get("X-Ratelimit-Remaining-Requests"), "but counted as a request")
	assert.Equal(t, http.StatusOK, chat(t, h, userMessage("", 97)).Code)
}

// nginxLimitReq is ngx_http_limit_req_lookup for one key, as nginx 1.22
// writes it: excess in thousandths of a request, time in milliseconds,
// rate in thousandths of a request per second.
type nginxLimitReq struct {
	rate, burst  int64
	excess, last int64
	seen         bool // the key's node exists
}

func (x *nginxLimitReq) admit(now int64) bool {
	if !x.seen { // a new node: excess 0
		x.seen, x.excess, x.last = true, 0, now
		return true
	}
	ms := max(now-x.last, 0)
	excess := max(x.excess-x.rate*ms/1000+1000, 0)
	if excess > x.burst {
		return false
	}
	x.excess = excess
	if ms != 0 {
		x.last = now
	}
	return true
}

// TestLeakyBucketIsNginxLimitReq holds LeakyBucket against nginx's code
// for requests that arrive on whole milliseconds, where nanoseconds and
// nginx's milliseconds agree: the same answer to every request.
func TestLeakyBucketIsNginxLimitReq(t *testing.T) {
	for _, tc := range []struct{ rate, burst int64 }{{20, 20}, {7, 3}, {1, 0}, {50, 5}} {
		for seed := range uint64(3) {
			clk := newClock()
			h := NewHandler(Config{Requests: LeakyBucket(tc.rate, time.Second, tc.burst), Now: clk.Now})
			ngx := &nginxLimitReq{rate: tc.rate * 1000, burst: tc.burst * 1000}
			admitted := 0
			for i, at := range arrivals(seed, 1000) {
				clk.Advance(at - clk.Now().Sub(epoch))
				want := http.StatusTooManyRequests
				if ngx.admit(at.Milliseconds()) {
					want = http.StatusOK
					admitted++
				}
				require.Equal(t, want, get(h).Code, "rate %d burst %d seed %d: request %d at %v", tc.rate, tc.burst, seed, i, at)
			}
			assert.EqualValues(t, admitted, h.Stats().Accepted)
		}
	}
}

func TestRetryAfterConfig(t *testing.T) {
	for _, tc := range []struct {
		retryAfter time.Duration
		s, ms      string
	}{
		{0, "1", "50"}, // the wait
		{time.Second, "1", "1000"},
		{1500 * time.Millisecond, "2", "1500"},
		{-1, "", ""},
	} {
		h := NewHandler(Config{Requests: LeakyBucket(20, time.Second, 0), RetryAfterMs: true, RetryAfter: tc.retryAfter, Now: newClock().Now})
		require.Equal(t, http.StatusOK, get(h).Code)
		w := get(h)
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		assert.Equal(t, tc.s, w.Header().Get("Retry-After"), "RetryAfter %v", tc.retryAfter)
		assert.Equal(t, tc.ms, w.Header().Get("Retry-After-Ms"), "RetryAfter %v", tc.retryAfter)
		assert.Contains(t, apiError(t, w).Error.Message, "try again in 50ms", "the body tells the wait")
	}
}
