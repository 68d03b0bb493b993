package llmclient_test

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
)

func Example() {
	api := llmtest.NewServer(llmtest.Config{ReplyTokens: 5}) // or "https://api.openai.com/v1"
	defer api.Close()

	client := llmclient.New(api.URL, "sk-example", llmclient.WithLimits(500, 30_000))
	req := llmclient.ChatRequest{
		Model:     "gpt-5-mini",
		Messages:  []llmclient.Message{{Role: "user", Content: "Say hello"}},
		MaxTokens: 50,
	}
	resp, err := client.Chat(context.Background(), req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(resp.Choices[0].Message.Content)
	fmt.Println("tokens:", resp.Usage.TotalTokens)

	for chunk, err := range client.ChatStream(context.Background(), req) {
		if err != nil {
			fmt.Println(err)
			return
		}
		if chunk.Usage != nil {
			fmt.Println("streamed tokens:", chunk.Usage.TotalTokens)
		}
	}
	// Output:
	// Lorem ipsum dolor si
	// tokens: 11
	// streamed tokens: 11
}
