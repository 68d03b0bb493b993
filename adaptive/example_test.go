package adaptive_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
)

func ExampleParse() {
	h := http.Header{}
	h.Set("retry-after-ms", "1500")
	h.Set("x-ratelimit-limit-tokens", "30000")
	h.Set("x-ratelimit-remaining-tokens", "0")
	h.Set("x-ratelimit-reset-tokens", "1m30.5s")

	f := adaptive.Parse(http.StatusTooManyRequests, h, time.Now())
	fmt.Println(f.Class, f.RetryAfter)
	fmt.Printf("%+v\n", f.Quotas[bucket.Tokens])
	rate, _ := f.Quotas[bucket.Tokens].Rate()
	fmt.Printf("%.0f tokens/s\n", rate)
	// Output:
	// rate_limited 1.5s
	// {Limit:30000 Remaining:0 Reset:1m30.5s Window:0s Source:X-Ratelimit-Limit-Tokens}
	// 331 tokens/s
}

func ExampleParseBody() {
	// A Gemini 429: no Retry-After header, the delay in the body.
	body := []byte(`{"error":{"code":429,"message":"Resource has been exhausted.","status":"RESOURCE_EXHAUSTED",` +
		`"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"3s"}]}}`)

	f := adaptive.Parse(http.StatusTooManyRequests, http.Header{}, time.Now())
	f = f.WithBody(adaptive.ParseBody(body))
	fmt.Println(f.Class, f.RetryAfter)

	// An OpenAI 429 that no wait will cure.
	body = []byte(`{"error":{"message":"You exceeded your current quota, please check your plan and billing details.",` +
		`"type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`)
	f = adaptive.Parse(http.StatusTooManyRequests, http.Header{}, time.Now())
	f = f.WithBody(adaptive.ParseBody(body))
	fmt.Println(f.Class)
	// Output:
	// rate_limited 3s
	// quota_exhausted
}
