package transport_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
)

// Bodies of refusals that give their delay in the body only.
const (
	geminiRetryInfo = `{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED",` +
		`"details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests",` +
		`"quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier","quotaValue":"15"}]},` +
		`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"3s"}]}}`
	geminiPerDay = `{"error":{"code":429,"message":"You exceeded your current quota.","status":"RESOURCE_EXHAUSTED",` +
		`"details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests",` +
		`"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","quotaValue":"200"}]},` +
		`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"3s"}]}}`
	openAITryAgain = `{"error":{"message":"Rate limit reached for gpt-4 in organization org-x on tokens per min (TPM): Limit 10000, Used 9500, Requested 1000. ` +
		`Please try again in 6.379s. Visit https://platform.openai.com/account/rate-limits to learn more.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`
)

// noJitter is a Retry with no jitter, so that a delay is the one asked for.
var noJitter = transport.WithRetry(transport.Retry{Jitter: -1})

// TestBodyDelayRetried: a refusal whose delay is in its body alone is
// retried after that delay, not after the backoff; a header's wins.
func TestBodyDelayRetried(t *testing.T) {
	for _, tt := range []struct {
		name   string
		status int
		hdr    map[string]string
		body   string
		delay  time.Duration
	}{
		{"Gemini RetryInfo", 429, nil, geminiRetryInfo, 3 * time.Second},
		{"OpenAI try again in", 429, nil, openAITryAgain, 6379 * time.Millisecond},
		{"a 503's body", 503, nil, geminiRetryInfo, 3 * time.Second},
		{"Retry-After wins", 429, map[string]string{"Retry-After": "1"}, geminiRetryInfo, time.Second},
		{"retry-after-ms wins", 429, map[string]string{"Retry-After-Ms": "250"}, openAITryAgain, 250 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(step{status: tt.status, header: tt.hdr, body: tt.body})
			defer s.Close()
			resp, clk := do(t, s, "POST", nil, noJitter)
			assert.Equal(t, 200, resp.StatusCode)
			assert.EqualValues(t, 2, s.hits.Load())
			sleeps := clk.Sleeps()
			require.NotEmpty(t, sleeps)
			assert.Equal(t, tt.delay, sleeps[0])
			for _, d := range sleeps[1:] { // the key's pause, already served
				assert.Zero(t, d)
			}
		})
	}
	t.Run("not on a 500", func(t *testing.T) {
		s := newScript(step{status: 500, body: openAITryAgain})
		defer s.Close()
		resp, clk := do(t, s, "GET", nil, noJitter)
		assert.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, []time.Duration{500 * time.Millisecond}, clk.Sleeps(), "the backoff")
	})
	t.Run("longer than MaxRetryAfter is returned", func(t *testing.T) {
		body := `{"error":{"message":"Please try again in 7m12s.","type":"requests","code":"rate_limit_exceeded"}}`
		s := newScript(step{status: 429, body: body})
		defer s.Close()
		resp, clk := do(t, s, "POST", nil)
		assert.Equal(t, 429, resp.StatusCode)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, body, string(got), "the body intact")
		assert.EqualValues(t, 1, s.hits.Load())
		assert.Empty(t, clk.Sleeps())
	})
}

// TestBodyDelayPausesKey: a delay in a 429's body (Gemini's RetryInfo)
// pauses the key as a Retry-After does: in the bucket, for the fleet, and
// in this Transport, for the requests after it.
func TestBodyDelayPausesKey(t *testing.T) {
	s := newScript(step{status: 429, body: geminiRetryInfo})
	defer s.Close()
	b := bucket.NewLocal(bucket.PerSecond(10), bucket.WithClock(frozen{}))
	clk := newFakeClock()
	tr := transport.New(nil, transport.WithBucket(b), transport.WithTestClock(clk.Now, clk.Sleep),
		transport.WithKey(func(*http.Request) string { return "k" }), transport.WithRetry(transport.Retry{MaxAttempts: 1}))
	resp, err := get(t, tr, context.Background(), s.URL)
	require.NoError(t, err)
	assert.Equal(t, 429, resp.StatusCode)

	r, err := b.Reserve(context.Background(), "k", bucket.N(1), 0)
	require.NoError(t, err)
	assert.False(t, r.OK, "the bucket's key is paused")
	assert.InDelta(t, 3*time.Second, r.RetryAfter, float64(200*time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = get(t, tr, ctx, s.URL)
	assert.ErrorIs(t, err, bucket.ErrDeadline, "paused past the deadline: fails at once")
	assert.EqualValues(t, 1, s.hits.Load())
	assert.Empty(t, clk.Sleeps())
}

// TestGeminiPerDayNotRetried: a Gemini 429 for a daily quota is quota
// exhausted: its 3 s RetryInfo would only draw the same 429 until the day
// is over, so it is returned at once, its body intact; the delay still
// pauses the key.
func TestGeminiPerDayNotRetried(t *testing.T) {
	s := newScript(step{status: 429, body: geminiPerDay})
	defer s.Close()
	b := bucket.NewLocal(bucket.PerSecond(10), bucket.WithClock(frozen{}))
	resp, clk := do(t, s, "POST", nil, transport.WithBucket(b), transport.WithKey(func(*http.Request) string { return "k" }))
	assert.Equal(t, 429, resp.StatusCode)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, geminiPerDay, string(got))
	assert.EqualValues(t, 1, s.hits.Load())
	assert.Empty(t, clk.Sleeps())
	r, err := b.Reserve(context.Background(), "k", bucket.N(1), 0)
	require.NoError(t, err)
	assert.False(t, r.OK, "paused for the RetryInfo")
}

// TestGitHubForbidden: GitHub answers a spent primary rate limit with 403
// and X-RateLimit-Remaining 0, retried at its X-RateLimit-Reset (a Unix
// time); its secondary limit with 403 and a Retry-After; any other 403 is
// returned as it is.
func TestGitHubForbidden(t *testing.T) {
	reset := func(d time.Duration) string { return strconv.FormatInt(newFakeClock().Now().Add(d).Unix(), 10) }
	for _, tt := range []struct {
		name     string
		hdr      []string
		attempts int32
		status   int
		delay    time.Duration // 0: no sleep
	}{
		{"primary: retried after the reset", []string{"X-RateLimit-Limit", "60", "X-RateLimit-Remaining", "0",
			"X-RateLimit-Reset", reset(5 * time.Second), "X-RateLimit-Used", "60", "X-RateLimit-Resource", "core"}, 2, 200, 5 * time.Second},
		{"primary: a reset past MaxRetryAfter is returned", []string{"X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "0",
			"X-RateLimit-Reset", reset(40 * time.Minute)}, 1, 403, 0},
		{"secondary: retried after Retry-After", []string{"Retry-After", "2", "X-RateLimit-Remaining", "4000"}, 2, 200, 2 * time.Second},
		{"secondary: Retry-After wins over the reset", []string{"Retry-After", "2", "X-RateLimit-Remaining", "0",
			"X-RateLimit-Reset", reset(30 * time.Second)}, 2, 200, 2 * time.Second},
		{"Discord: reset-after", []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "1.5",
			"X-RateLimit-Bucket", "abcd"}, 2, 200, 1500 * time.Millisecond},
		{"quota left: not retried", []string{"X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "4000"}, 1, 403, 0},
		{"no headers: not retried", nil, 1, 403, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := status(403, tt.hdr...)
			st.body = `{"message":"API rate limit exceeded for user ID 1.","documentation_url":"https://docs.github.com/rest/overview/resources-in-the-rest-api#rate-limiting"}`
			s := newScript(st)
			defer s.Close()
			resp, clk := do(t, s, "GET", nil, noJitter)
			assert.Equal(t, tt.status, resp.StatusCode)
			assert.Equal(t, tt.attempts, s.hits.Load(), "attempts")
			if tt.delay == 0 {
				assert.Empty(t, clk.Sleeps())
				return
			}
			sleeps := clk.Sleeps()
			require.NotEmpty(t, sleeps)
			assert.Equal(t, tt.delay, sleeps[0])
		})
	}
}

// TestGitHubForbiddenPausesKey: GitHub's 403 for a spent quota pauses the
// key until its reset, for the fleet, and counts as a refusal; a 403
// without its headers does not.
func TestGitHubForbiddenPausesKey(t *testing.T) {
	reset := strconv.FormatInt(frozen{}.Now().Add(5*time.Second).Unix(), 10)
	for _, tt := range []struct {
		name   string
		hdr    []string
		paused bool
	}{
		{"remaining 0", []string{"X-RateLimit-Limit", "60", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", reset}, true},
		{"no rate limit headers", nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(status(403, tt.hdr...))
			defer s.Close()
			b := bucket.NewLocal(bucket.PerSecond(10), bucket.WithClock(frozen{}))
			tr := transport.New(nil, transport.WithBucket(b), transport.WithTestClock(frozen{}.Now, newFakeClock().Sleep),
				transport.WithKey(func(*http.Request) string { return "k" }), transport.WithRetry(transport.Retry{MaxAttempts: 1}))
			resp, err := get(t, tr, context.Background(), s.URL)
			require.NoError(t, err)
			assert.Equal(t, 403, resp.StatusCode)
			r, err := b.Reserve(context.Background(), "k", bucket.N(1), 0)
			require.NoError(t, err)
			assert.Equal(t, !tt.paused, r.OK)
			if tt.paused {
				assert.InDelta(t, 5*time.Second, r.RetryAfter, float64(200*time.Millisecond))
			}
		})
	}
}
