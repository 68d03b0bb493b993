package transport_test

import (
	"context"
	"fmt"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
)

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
