package llmtest_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/sluicehq/sluice/llmclient/llmtest"
)

func Example() {
	now := time.Date(2025, 1, 1, 0, 0, 30, 0, time.UTC)
	srv := llmtest.NewServer(llmtest.Config{
		Requests: llmtest.FixedWindow(2, time.Minute),
		Headers:  llmtest.OpenAIHeaders,
		Now:      func() time.Time { return now },
	})
	defer srv.Close()

	for range 3 {
		resp, err := http.Post(srv.URL+"/chat/completions", "application/json",
			strings.NewReader(`{"model":"gpt-4.1","messages":[{"role":"user","content":"Hi"}]}`))
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Printf("%s, remaining %s, Retry-After %q\n", resp.Status,
			resp.Header.Get("X-Ratelimit-Remaining-Requests"), resp.Header.Get("Retry-After"))
	}
	st := srv.Stats()
	fmt.Println("accepted:", st.Accepted, "rejected:", st.Rejected, "tokens:", st.TotalTokens)
	fmt.Println("most in a minute:", srv.MaxInWindow(llmtest.Requests, time.Minute))
	// Output:
	// 200 OK, remaining 1, Retry-After ""
	// 200 OK, remaining 0, Retry-After ""
	// 429 Too Many Requests, remaining 0, Retry-After "30"
	// accepted: 2 rejected: 1 tokens: 40
	// most in a minute: 2
}

func ExampleHandler_Series() {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	limit := llmtest.TokenBucket(2, time.Second, 2)
	h := llmtest.NewHandler(llmtest.Config{Requests: limit, Now: func() time.Time { return now }})
	for range 4 {
		for range 3 {
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/v1/anything", nil))
		}
		now = now.Add(500 * time.Millisecond)
	}
	for _, p := range h.Series(time.Second) {
		fmt.Printf("%s admitted %d (limit %g), refused %d\n",
			p.Start.Format("15:04:05"), p.Requests, limit.Rate()*time.Second.Seconds(), p.Rejected)
	}
	// Output:
	// 00:00:00 admitted 3 (limit 2), refused 3
	// 00:00:01 admitted 2 (limit 2), refused 4
}
