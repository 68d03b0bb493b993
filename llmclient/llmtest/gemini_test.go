package llmtest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
)

// geminiError decodes a Gemini error body.
func geminiError(t *testing.T, w *httptest.ResponseRecorder) geminiStatus {
	t.Helper()
	var e geminiStatus
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &e), w.Body.String())
	return e
}

// noRateLimitHeaders asserts that w carries no header of a rate limit.
func noRateLimitHeaders(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	for k := range w.Header() {
		switch k {
		case "Content-Type":
		default:
			t.Errorf("header %s: %q, want none", k, w.Header().Get(k))
		}
	}
}

func TestGeminiRefusal(t *testing.T) {
	clk := newClock()
	// RetryAfter and RetryAfterMs are ignored: Gemini sends neither.
	h := NewHandler(Config{Requests: SlidingWindow(2, time.Minute), Gemini: true,
		RetryAfter: time.Second, RetryAfterMs: true, Now: clk.Now})
	req := ChatRequest{Model: "gemini-2.5-flash", Messages: []Message{{Role: "user", Content: "Hi"}}}
	for range 2 {
		require.Equal(t, http.StatusOK, chat(t, h, req).Code)
	}
	clk.Advance(677812966 * time.Nanosecond)
	w := chat(t, h, req)
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	noRateLimitHeaders(t, w)
	assert.Equal(t, "application/json; charset=UTF-8", w.Header().Get("Content-Type"))
	e := geminiError(t, w)
	assert.Equal(t, 429, e.Error.Code)
	assert.Equal(t, "RESOURCE_EXHAUSTED", e.Error.Status)
	assert.Equal(t, "You exceeded your current quota, please check your plan and billing details.\n"+
		"* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_paid_tier_requests, limit: 2, model: gemini-2.5-flash\n"+
		"Please retry in 59.322187034s.", e.Error.Message)
	assert.Equal(t, []geminiDetails{
		{Type: geminiQuotaFailure, Violations: []geminiViolation{{
			QuotaMetric:     "generativelanguage.googleapis.com/generate_content_paid_tier_requests",
			QuotaID:         "GenerateRequestsPerMinutePerProjectPerModel",
			QuotaDimensions: map[string]string{"location": "global", "model": "gemini-2.5-flash"},
			QuotaValue:      "2",
		}}},
		{Type: geminiRetryInfo, RetryDelay: "59s"},
	}, e.Error.Details)
	st := h.Stats()
	assert.Equal(t, int64(2), st.Accepted)
	assert.Equal(t, int64(1), st.Rejected)

	// sluice reads the exact delay, which the truncated RetryInfo is not.
	b := adaptive.ParseBody(w.Body.Bytes())
	assert.Equal(t, adaptive.Body{RetryAfter: 59322187034 * time.Nanosecond}, b)
}

func TestGeminiDelays(t *testing.T) {
	for _, tc := range []struct {
		wait          time.Duration
		message, info string
	}{
		{356313387 * time.Nanosecond, "356.313387ms", "0s"},
		{999999999 * time.Nanosecond, "999.999999ms", "0s"},
		{time.Second, "1s", "1s"},
		{1500 * time.Millisecond, "1.5s", "1s"},
		{62*time.Second + 500*time.Millisecond, "1m2.5s", "62s"},
	} {
		t.Run(tc.message, func(t *testing.T) {
			clk := newClock()
			// A plain call names no model.
			h := NewHandler(Config{Requests: FixedWindow(1, time.Hour), Gemini: true, Now: clk.Now})
			require.Equal(t, http.StatusOK, get(h).Code)
			clk.Advance(time.Hour - tc.wait)
			w := get(h)
			require.Equal(t, http.StatusTooManyRequests, w.Code)
			noRateLimitHeaders(t, w)
			e := geminiError(t, w)
			require.Len(t, e.Error.Details, 2)
			assert.Equal(t, map[string]string{"location": "global"}, e.Error.Details[0].Violations[0].QuotaDimensions)
			assert.Equal(t, geminiDetails{Type: geminiRetryInfo, RetryDelay: tc.info}, e.Error.Details[1])
			assert.Contains(t, e.Error.Message, "limit: 1\nPlease retry in "+tc.message+".")
			assert.NotContains(t, e.Error.Message, "model:")
			assert.Equal(t, adaptive.Body{RetryAfter: tc.wait}, adaptive.ParseBody(w.Body.Bytes()))
		})
	}
}

func TestGeminiRefusingDimensions(t *testing.T) {
	clk := newClock()
	h := NewHandler(Config{ChargeCap: true, Gemini: true, Now: clk.Now,
		Requests: FixedWindow(2, 24*time.Hour),
		Tokens:   TokenBucket(100, time.Minute, 100)})
	// "abcdefgh" is 2+3 prompt tokens: the cost is 100, all the tokens.
	ask := func() *httptest.ResponseRecorder { return chat(t, h, userMessage("abcdefgh", 95)) }
	require.Equal(t, http.StatusOK, ask().Code)

	// Only the token limit refuses: one violation, per minute.
	clk.Advance(30 * time.Second)
	w := ask()
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	e := geminiError(t, w)
	require.Len(t, e.Error.Details, 2)
	assert.Equal(t, []geminiViolation{
		{"generativelanguage.googleapis.com/generate_content_paid_tier_input_token_count", "GenerateContentInputTokensPerModelPerMinute",
			map[string]string{"location": "global", "model": "gpt-test"}, "100"},
	}, e.Error.Details[0].Violations)
	assert.Equal(t, geminiDetails{Type: geminiRetryInfo, RetryDelay: "30s"}, e.Error.Details[1])
	assert.Equal(t, adaptive.Body{RetryAfter: 30 * time.Second}, adaptive.ParseBody(w.Body.Bytes()))

	// Both refuse: both named, the wait the longer, the day's.
	clk.Advance(30 * time.Second)
	require.Equal(t, http.StatusOK, ask().Code)
	clk.Advance(30 * time.Second)
	w = ask()
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	e = geminiError(t, w)
	require.Len(t, e.Error.Details, 2)
	assert.Equal(t, []geminiViolation{
		{"generativelanguage.googleapis.com/generate_content_paid_tier_requests", "GenerateRequestsPerDayPerProjectPerModel",
			map[string]string{"location": "global", "model": "gpt-test"}, "2"},
		{"generativelanguage.googleapis.com/generate_content_paid_tier_input_token_count", "GenerateContentInputTokensPerModelPerMinute",
			map[string]string{"location": "global", "model": "gpt-test"}, "100"},
	}, e.Error.Details[0].Violations)
	assert.Equal(t, geminiDetails{Type: geminiRetryInfo, RetryDelay: "86310s"}, e.Error.Details[1])
	assert.Contains(t, e.Error.Message, "Please retry in 23h58m30s.")
	// A daily quota: sluice takes it as spent, the delay kept.
	assert.Equal(t, adaptive.Body{QuotaExhausted: true, RetryAfter: 86310 * time.Second}, adaptive.ParseBody(w.Body.Bytes()))
	st := h.Stats()
	assert.Equal(t, [4]int64{1, 2}, st.RejectedBy)
}

func TestGeminiRequestTooLarge(t *testing.T) {
	h := NewHandler(Config{ChargeCap: true, Gemini: true, Now: newClock().Now,
		Tokens: TokenBucket(10, time.Minute, 10)})
	w := chat(t, h, userMessage("abcdefgh", 95))
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	noRateLimitHeaders(t, w)
	e := geminiError(t, w)
	assert.Equal(t, "RESOURCE_EXHAUSTED", e.Error.Status)
	require.Len(t, e.Error.Details, 1, "no RetryInfo: no wait will do")
	assert.Equal(t, geminiQuotaFailure, e.Error.Details[0].Type)
	assert.NotContains(t, e.Error.Message, "retry")
	assert.Equal(t, adaptive.Body{}, adaptive.ParseBody(w.Body.Bytes()))
}

func TestGeminiAdmissionsUnchanged(t *testing.T) {
	// The style changes the refusals' answer, not what the limits decide,
	// nor the headers asked for.
	clk := newClock()
	h := NewHandler(Config{Requests: TokenBucket(2, time.Second, 2), Headers: OpenAIHeaders, Gemini: true, Now: clk.Now})
	require.Equal(t, http.StatusOK, get(h).Code)
	require.Equal(t, http.StatusOK, get(h).Code)
	clk.Advance(250 * time.Millisecond)
	w := get(h)
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "0", w.Header().Get("X-Ratelimit-Remaining-Requests"))
	assert.Empty(t, w.Header().Get("Retry-After"))
	assert.Equal(t, adaptive.Body{RetryAfter: 250 * time.Millisecond}, adaptive.ParseBody(w.Body.Bytes()))
}
