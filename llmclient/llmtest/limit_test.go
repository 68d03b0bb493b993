package llmtest

import (
	"fmt"
	"math"
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
	assert.Equal(t, [2]int64{1, 1}, st.RejectedBy)
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
	assert.Equal(t, [2]int64{2, 2}, h.Stats().RejectedBy)
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
