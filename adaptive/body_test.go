package adaptive_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/adaptive"
)

// geminiBody is a Gemini 429 body with these details.
func geminiBody(details ...string) string {
	return `{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.",` +
		`"status":"RESOURCE_EXHAUSTED","details":[` + strings.Join(details, ",") + `]}}`
}

const (
	retryInfo3s  = `{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"3s"}`
	perDayQuota  = `{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","quotaDimensions":{"location":"global","model":"gemini-2.0-flash"},"quotaValue":"200"}]}`
	perMinQuota  = `{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier","quotaValue":"15"}]}`
	geminiHelp   = `{"@type":"type.googleapis.com/google.rpc.Help","links":[{"description":"Learn more about Gemini API quotas","url":"https://ai.google.dev/gemini-api/docs/rate-limits"}]}`
	openAITPMMsg = "Rate limit reached for gpt-4 in organization org-x on tokens per min (TPM): Limit 10000, Used 9500, Requested 1000. Please try again in 6.379s. Visit https://platform.openai.com/account/rate-limits to learn more."
)

// openAIBody is an OpenAI rate limit body with this message.
func openAIBody(msg string) string {
	return `{"error":{"message":"` + msg + `","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`
}

func TestParseBody(t *testing.T) {
	tests := []struct {
		name string
		body string
		want adaptive.Body
	}{
		// Quota exhausted: no wait fixes it.
		{"OpenAI insufficient_quota",
			`{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`,
			adaptive.Body{QuotaExhausted: true}},
		{"OpenAI insufficient_quota, null code",
			`{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":null}}`,
			adaptive.Body{QuotaExhausted: true}},
		{"OpenAI billing hard limit",
			`{"error":{"message":"Billing hard limit has been reached","type":"invalid_request_error","param":null,"code":"billing_hard_limit_reached"}}`,
			adaptive.Body{QuotaExhausted: true}},
		{"Anthropic billing_error",
			`{"type":"error","error":{"type":"billing_error","message":"There is an issue with your account's billing."}}`,
			adaptive.Body{QuotaExhausted: true}},
		{"Anthropic credit balance",
			`{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}`,
			adaptive.Body{QuotaExhausted: true}},
		{"a numeric code does not hide the type",
			`{"error":{"code":429,"type":"insufficient_quota"}}`, adaptive.Body{QuotaExhausted: true}},
		{"trailing whitespace",
			`{"error":{"code":"insufficient_quota"}}` + strings.Repeat(" ", 5000), adaptive.Body{QuotaExhausted: true}},

		// Gemini.
		{"Gemini RetryInfo", geminiBody(retryInfo3s), adaptive.Body{RetryAfter: 3 * time.Second}},
		{"Gemini, as sent: per-minute quota, help, retry info",
			geminiBody(perMinQuota, geminiHelp, `{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"39s"}`),
			adaptive.Body{RetryAfter: 39 * time.Second}},
		{"Gemini per-day quota is exhausted, the delay kept",
			geminiBody(perDayQuota, geminiHelp, retryInfo3s),
			adaptive.Body{QuotaExhausted: true, RetryAfter: 3 * time.Second}},
		{"Gemini per-day metric",
			geminiBody(`{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_requests_per_model_per_day"}]}`),
			adaptive.Body{QuotaExhausted: true}},
		{"Gemini per-minute and per-day: the day wins",
			geminiBody(`{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateContentInputTokensPerModelPerMinute-FreeTier"},{"quotaId":"GenerateContentInputTokensPerModelPerDay-FreeTier"}]}`),
			adaptive.Body{QuotaExhausted: true}},
		{"Gemini fractional delays", geminiBody(`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}`),
			adaptive.Body{RetryAfter: 1500 * time.Millisecond}},
		{"Gemini delay with millis", geminiBody(`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"0.250s"}`),
			adaptive.Body{RetryAfter: 250 * time.Millisecond}},
		{"Gemini delay in nanos", geminiBody(`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.000340012s"}`),
			adaptive.Body{RetryAfter: 1000340012 * time.Nanosecond}},
		{"Gemini RetryInfo wins over the message",
			`{"error":{"code":429,"message":"Please retry in 39.010806355s.","status":"RESOURCE_EXHAUSTED","details":[` + retryInfo3s + `]}}`,
			adaptive.Body{RetryAfter: 3 * time.Second}},
		{"Gemini RetryInfo truncated to the second: the message's exact delay",
			`{"error":{"code":429,"message":"* Quota exceeded for metric: x, limit: 10\nPlease retry in 59.322187034s.","status":"RESOURCE_EXHAUSTED","details":[` +
				`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"59s"}]}}`,
			adaptive.Body{RetryAfter: 59322187034 * time.Nanosecond}},
		{"Gemini RetryInfo 0s below a second: the message's exact delay",
			`{"error":{"code":429,"message":"Please retry in 356.313387ms.","status":"RESOURCE_EXHAUSTED","details":[` +
				`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"0s"}]}}`,
			adaptive.Body{RetryAfter: 356313387 * time.Nanosecond}},
		{"Gemini RetryInfo 0s alone says nothing",
			geminiBody(`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"0s"}`), adaptive.Body{}},
		{"Gemini message a second or more past the RetryInfo: the RetryInfo",
			`{"error":{"code":429,"message":"Please retry in 4s.","status":"RESOURCE_EXHAUSTED","details":[` + retryInfo3s + `]}}`,
			adaptive.Body{RetryAfter: 3 * time.Second}},
		{"Gemini message before the RetryInfo: the RetryInfo",
			`{"error":{"code":429,"message":"Please retry in 2.9s.","status":"RESOURCE_EXHAUSTED","details":[` + retryInfo3s + `]}}`,
			adaptive.Body{RetryAfter: 3 * time.Second}},
		{"Gemini message alone",
			`{"error":{"code":429,"message":"* Quota exceeded for metric: x, limit: 10\nPlease retry in 39.010806355s.","status":"RESOURCE_EXHAUSTED"}}`,
			adaptive.Body{RetryAfter: 39010806355 * time.Nanosecond}},
		{"Gemini malformed delays are ignored", geminiBody(
			`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"-3s"}`,
			`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"3"}`,
			`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1e3s"}`,
			`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":".5s"}`,
			`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"99999999999999s"}`,
			`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":{"seconds":3}}`,
			`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":3}`),
			adaptive.Body{}},
		{"Gemini: the first valid RetryInfo", geminiBody(
			`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"x"}`,
			`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"2s"}`, retryInfo3s),
			adaptive.Body{RetryAfter: 2 * time.Second}},
		{"Gemini: retryDelay of another detail type", geminiBody(`{"@type":"type.googleapis.com/google.rpc.Help","retryDelay":"3s"}`),
			adaptive.Body{}},
		{"Gemini: PerDay in another detail type", geminiBody(`{"@type":"type.googleapis.com/google.rpc.ErrorInfo","violations":[{"quotaId":"PerDay"}]}`),
			adaptive.Body{}},
		{"Gemini: details not a list", `{"error":{"code":429,"details":{"retryDelay":"3s"}}}`, adaptive.Body{}},

		// OpenAI's message text.
		{"OpenAI try again in seconds", openAIBody(openAITPMMsg), adaptive.Body{RetryAfter: 6379 * time.Millisecond}},
		{"OpenAI try again in minutes", openAIBody("Rate limit reached for gpt-4o on requests per day (RPD): Limit 10000, Used 10000, Requested 1. Please try again in 1m30s. Visit ..."),
			adaptive.Body{RetryAfter: 90 * time.Second}},
		{"OpenAI try again in hours", openAIBody("Rate limit reached ... on tokens per day (TPD): Limit 90000, Used 89000, Requested 2000. Please try again in 6h8m31.2s."),
			adaptive.Body{RetryAfter: 6*time.Hour + 8*time.Minute + 31200*time.Millisecond}},
		{"OpenAI try again in ms", openAIBody("Rate limit reached for requests. Please try again in 20ms."),
			adaptive.Body{RetryAfter: 20 * time.Millisecond}},
		{"try again in seconds, in words", openAIBody("Please try again in 2.5 seconds."),
			adaptive.Body{RetryAfter: 2500 * time.Millisecond}},
		{"Azure retry after seconds", `{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-02-01 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 17 seconds. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit."}}`,
			adaptive.Body{RetryAfter: 17 * time.Second}},
		{"retry after 1 second", openAIBody("Please retry after 1 second."), adaptive.Body{RetryAfter: time.Second}},
		{"upper case", openAIBody("PLEASE TRY AGAIN IN 7S"), adaptive.Body{RetryAfter: 7 * time.Second}},
		{"the first well-formed delay", openAIBody("try again in a while, or try again in 4s."), adaptive.Body{RetryAfter: 4 * time.Second}},
		{"a bare number is no delay", openAIBody("Please try again in 6."), adaptive.Body{}},
		{"an unknown unit is no delay", openAIBody("Please try again in 6 fortnights."), adaptive.Body{}},
		{"a negative delay is no delay", openAIBody("Please try again in -6s."), adaptive.Body{}},
		{"a delay of 292 years is no delay", openAIBody("Please try again in 9999999999h."), adaptive.Body{}},
		{"no delay", openAIBody("Rate limit reached. Please try again later."), adaptive.Body{}},
		{"the words outside the message", `{"error":{"message":"x","type":"try again in 3s"}}`, adaptive.Body{}},

		// Nothing.
		{"OpenAI rate limit without delay",
			`{"error":{"message":"Rate limit reached for gpt-4 in organization org-x on tokens per min.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`,
			adaptive.Body{}},
		{"Anthropic rate limit",
			`{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}`,
			adaptive.Body{}},
		{"Anthropic overloaded", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, adaptive.Body{}},
		{"the words elsewhere", `{"error":{"message":"not insufficient_quota","type":"x"},"code":"insufficient_quota"}`, adaptive.Body{}},
		{"error as a string", `{"error":"insufficient_quota"}`, adaptive.Body{}},
		{"cut short", `{"error":{"code":"insufficient_quota"`, adaptive.Body{}},
		{"Gemini cut short", geminiBody(retryInfo3s)[:120], adaptive.Body{}},
		{"not JSON", `insufficient_quota, try again in 3s`, adaptive.Body{}},
		{"array", `[{"error":{"code":"insufficient_quota"}}]`, adaptive.Body{}},
		{"empty", ``, adaptive.Body{}},
		{"null", `null`, adaptive.Body{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, adaptive.ParseBody([]byte(tt.body)))
		})
	}
}

func TestWithBody(t *testing.T) {
	spent := adaptive.Body{QuotaExhausted: true, RetryAfter: 3 * time.Second}
	delay := adaptive.Body{RetryAfter: 3 * time.Second}
	tests := []struct {
		name string
		f    adaptive.Feedback
		b    adaptive.Body
		want adaptive.Feedback
	}{
		{"a body's delay when the header gives none",
			adaptive.Feedback{Class: adaptive.RateLimited}, delay,
			adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: 3 * time.Second, HasRetryAfter: true}},
		{"a body's delay when the header asks for no wait",
			adaptive.Feedback{Class: adaptive.RateLimited, HasRetryAfter: true}, delay,
			adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: 3 * time.Second, HasRetryAfter: true}},
		{"the header's delay wins",
			adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: time.Second, HasRetryAfter: true}, delay,
			adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: time.Second, HasRetryAfter: true}},
		{"quota exhausted keeps the delay",
			adaptive.Feedback{Class: adaptive.RateLimited}, spent,
			adaptive.Feedback{Class: adaptive.QuotaExhausted, RetryAfter: 3 * time.Second, HasRetryAfter: true}},
		{"overloaded takes the delay, not the verdict",
			adaptive.Feedback{Class: adaptive.Overloaded}, spent,
			adaptive.Feedback{Class: adaptive.Overloaded, RetryAfter: 3 * time.Second, HasRetryAfter: true}},
		{"accepted is left alone",
			adaptive.Feedback{Class: adaptive.Accepted}, spent,
			adaptive.Feedback{Class: adaptive.Accepted}},
		{"nothing in the body",
			adaptive.Feedback{Class: adaptive.RateLimited, Epoch: 7}, adaptive.Body{},
			adaptive.Feedback{Class: adaptive.RateLimited, Epoch: 7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.f.WithBody(tt.b))
		})
	}
}

func TestParseStreamError(t *testing.T) {
	for _, c := range []struct {
		data  string
		class adaptive.Class
		after time.Duration
		ok    bool
	}{
		{`{"type":"error","error":{"type":"overloaded_error","message":"adaptive.Overloaded"}}`, adaptive.Overloaded, 0, true},
		{`{"type":"error","error":{"type":"rate_limit_error","message":"Please try again in 2s."}}`, adaptive.RateLimited, 2 * time.Second, true},
		{`{"error":{"message":"Rate limit reached. Please try again in 20ms.","type":"tokens","code":"rate_limit_exceeded"}}`, adaptive.RateLimited, 20 * time.Millisecond, true},
		{`{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`, adaptive.QuotaExhausted, 0, true},
		{`{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`, adaptive.Accepted, 0, false},
		{`{"choices":[{"delta":{"content":"error"}}]}`, adaptive.Accepted, 0, false},
		{`{"error":`, adaptive.Accepted, 0, false},
	} {
		fb, ok := adaptive.ParseStreamError([]byte(c.data))
		assert.Equal(t, c.ok, ok, c.data)
		assert.Equal(t, c.class, fb.Class, c.data)
		assert.Equal(t, c.after, fb.RetryAfter, c.data)
	}
}
