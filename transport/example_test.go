package transport_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
	"github.com/sony/gobreaker/v2"
)

func Example() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "hello")
	}))
	defer api.Close()

	client := &http.Client{Transport: transport.New(nil,
		transport.WithBucket(bucket.NewLocal(bucket.PerSecond(20))),
		transport.WithRetry(transport.Retry{MaxAttempts: 4}),
		transport.WithBreaker(gobreaker.Settings{Name: "api", Timeout: 30 * time.Second}),
	)}
	resp, err := client.Get(api.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.Status, string(body))
	// Output: 200 OK hello
}

// The official OpenAI SDK, throttled by a bucket shared through Redis by
// every process of the fleet, one bucket per API key. The SDK's own retries
// are turned off: sluice retries, through the bucket.
func Example_openAI() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	httpClient := transport.NewClient(
		transport.WithBucket(bucket.NewRedis(rdb, bucket.PerMinute(500))),
		transport.WithKey(transport.CredentialKey),
	)
	client := openai.NewClient(
		option.WithHTTPClient(httpClient),
		option.WithMaxRetries(0),
	)
	res, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    "gpt-5-mini",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Choices[0].Message.Content)
}

func ExampleCredentialKey() {
	req, _ := http.NewRequest("POST", "https://api.openai.com/v1/chat/completions", nil)
	req.Header.Set("Authorization", "Bearer sk-example")
	fmt.Println(transport.CredentialKey(req))
	// Output: https://api.openai.com#f2d4b279b82a
}
