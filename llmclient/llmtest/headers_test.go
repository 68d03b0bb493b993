package llmtest

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHeaderStyles(t *testing.T) {
	openai := map[string]string{
		"X-Ratelimit-Limit-Requests":     "20",
		"X-Ratelimit-Remaining-Requests": "19",
		"X-Ratelimit-Reset-Requests":     "50s",
		"X-Ratelimit-Limit-Tokens":       "1000",
		"X-Ratelimit-Remaining-Tokens":   "900",
		"X-Ratelimit-Reset-Tokens":       "6s",
	}
	anthropic := map[string]string{
		"Anthropic-Ratelimit-Requests-Limit":     "20",
		"Anthropic-Ratelimit-Requests-Remaining": "19",
		"Anthropic-Ratelimit-Requests-Reset":     "2025-01-01T00:01:00Z",
		"Anthropic-Ratelimit-Tokens-Limit":       "1000",
		"Anthropic-Ratelimit-Tokens-Remaining":   "900",
		"Anthropic-Ratelimit-Tokens-Reset":       "2025-01-01T00:00:16Z",
	}
	ietf := map[string]string{
		"Ratelimit-Policy": `"requests";q=20;w=60, "tokens";q=1000;w=60`,
		"Ratelimit":        `"requests";r=19;t=50, "tokens";r=900;t=6`,
	}
	all := []map[string]string{openai, anthropic, ietf}
	for _, tc := range []struct {
		name    string
		headers Headers
		want    []map[string]string
	}{
		{"none", 0, nil},
		{"OpenAI", OpenAIHeaders, []map[string]string{openai}},
		{"Anthropic", AnthropicHeaders, []map[string]string{anthropic}},
		{"IETF", IETFHeaders, []map[string]string{ietf}},
		{"all", OpenAIHeaders | AnthropicHeaders | IETFHeaders, all},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			clk.Advance(10 * time.Second)
			h := NewHandler(Config{ChargeCap: true,
				Requests: FixedWindow(20, time.Minute),
				Tokens:   TokenBucket(1000, time.Minute, 1000),
				Headers:  tc.headers,
				Now:      clk.Now,
			})
			// "abcdefgh" is 2+3 prompt tokens: the cost is 100.
			w := chat(t, h, userMessage("abcdefgh", 95))
			require.Equal(t, http.StatusOK, w.Code)
			sent := map[string]bool{}
			for _, want := range tc.want {
				for k, v := range want {
					assert.Equal(t, v, w.Header().Get(k), k)
					sent[k] = true
				}
			}
			for _, m := range all {
				for k := range m {
					if !sent[k] {
						assert.Empty(t, w.Header().Values(k), k)
					}
				}
			}
		})
	}
}

func TestHeadersOnRejection(t *testing.T) {
	clk := newClock()
	h := NewHandler(Config{ChargeCap: true,
		Requests: TokenBucket(2, time.Second, 2),
		Headers:  OpenAIHeaders | AnthropicHeaders | IETFHeaders,
		Now:      clk.Now,
	})
	clk.Advance(100 * time.Millisecond)
	get(h)
	get(h)
	w := get(h)
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	for k, v := range map[string]string{
		"Retry-After":                            "1",
		"X-Ratelimit-Limit-Requests":             "2",
		"X-Ratelimit-Remaining-Requests":         "0",
		"X-Ratelimit-Reset-Requests":             "1s",
		"Anthropic-Ratelimit-Requests-Remaining": "0",
		"Anthropic-Ratelimit-Requests-Reset":     "2025-01-01T00:00:02Z", // 1.1 s, rounded up
		"Ratelimit-Policy":                       `"requests";q=2;w=1`,
		"Ratelimit":                              `"requests";r=0;t=1`,
	} {
		assert.Equal(t, v, w.Header().Get(k), k)
	}
	assert.Empty(t, w.Header().Values("Retry-After-Ms"), "off unless RetryAfterMs")
	assert.Empty(t, w.Header().Values("X-Ratelimit-Limit-Tokens"), "tokens are not limited")

	clk.Advance(750 * time.Millisecond)
	w = get(h)
	require.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "0", w.Header().Get("X-Ratelimit-Remaining-Requests"), "half a token is none")
	assert.Equal(t, "750ms", w.Header().Get("X-Ratelimit-Reset-Requests"), "1.5 tokens missing")
}

func TestRetryAfterRounding(t *testing.T) {
	for _, tc := range []struct {
		wait      time.Duration
		after, ms string
	}{
		{1, "1", "1"},
		{1500 * time.Microsecond, "1", "2"},
		{999 * time.Millisecond, "1", "999"},
		{time.Second, "1", "1000"},
		{time.Second + 1, "2", "1001"},
		{9 * time.Second, "9", "9000"},
	} {
		clk := newClock()
		h := NewHandler(Config{Requests: FixedWindow(1, 10*time.Second), RetryAfterMs: true, Now: clk.Now})
		clk.Advance(10*time.Second - tc.wait)
		get(h)
		w := get(h)
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		assert.Equal(t, tc.after, w.Header().Get("Retry-After"), tc.wait)
		assert.Equal(t, tc.ms, w.Header().Get("Retry-After-Ms"), tc.wait)
	}
}

func TestOpenAIDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                           "0s",
		1:                           "1ms",
		20 * time.Millisecond:       "20ms",
		time.Second:                 "1s",
		1500 * time.Millisecond:     "1.5s",
		6 * time.Minute:             "6m0s",
		179561*time.Millisecond + 1: "2m59.562s",
	} {
		assert.Equal(t, want, openAIDuration(d), d)
	}
}

func TestIETFWindowOfATokenBucket(t *testing.T) {
	for _, tc := range []struct {
		l    Limit
		want string
	}{
		{TokenBucket(10, time.Second, 5), `"requests";q=5;w=1`},   // fills in 0.5 s: at least 1
		{TokenBucket(10, time.Second, 25), `"requests";q=25;w=3`}, // 2.5 s, rounded up
		{TokenBucket(500, time.Minute, 500), `"requests";q=500;w=60`},
		{SlidingWindow(3, 1500*time.Millisecond), `"requests";q=3;w=2`},
	} {
		h := NewHandler(Config{Requests: tc.l, Headers: IETFHeaders, Now: newClock().Now})
		assert.Equal(t, tc.want, get(h).Header().Get("RateLimit-Policy"), tc.l)
	}
}
