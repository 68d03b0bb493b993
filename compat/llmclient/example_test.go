package llmclient_test

import (
	"context"
	"fmt"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
)

// The official OpenAI client, with its calls charged an estimate of their
// tokens and reconciled with their usage. Streams report their usage only
// if asked to, with StreamOptions.IncludeUsage.
func Example_openAI() {
	api := llmtest.NewServer(llmtest.Config{ReplyTokens: 5}) // or the default base URL
	defer api.Close()

	b := bucket.NewLocal(bucket.PerMinute(500), bucket.WithLimit(bucket.Tokens, bucket.PerMinute(30_000)))
	httpClient := transport.NewClient(
		transport.WithBucket(b),
		transport.WithKey(transport.CredentialKey),
		transport.WithCost(llmclient.RequestCost(nil)),
		transport.WithUsage(llmclient.MeterUsage),
	)
	client := openai.NewClient(
		option.WithBaseURL(api.URL),
		option.WithAPIKey("sk-example"),
		option.WithHTTPClient(httpClient),
		option.WithMaxRetries(0), // sluice retries, through the bucket
	)
	res, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:     "gpt-5-mini",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
		MaxTokens: openai.Int(50),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("tokens:", res.Usage.TotalTokens)
	// Output: tokens: 11
}
