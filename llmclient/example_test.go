package llmclient_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
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

// ExampleOpenAI puts the OpenAI preset in an http.Client, the one an
// official SDK takes (openai-go: option.WithHTTPClient, with
// option.WithMaxRetries(0)), and shows what the call was charged: one
// request and its estimated tokens (the prompt's plus max_tokens), the
// prompt's part reconciled with the usage the response reported once its
// body was closed.
func ExampleOpenAI() {
	api := llmtest.NewServer(llmtest.Config{ReplyTokens: 5}) // or https://api.openai.com/v1
	defer api.Close()

	b := bucket.NewLocal(bucket.PerMinute(500), bucket.WithLimit(bucket.Tokens, bucket.PerMinute(30_000)))
	tr := transport.New(nil, llmclient.OpenAI(b), transport.WithMaxWait(time.Minute))
	hc := &http.Client{Transport: tr}

	body := `{"model":"gpt-5-mini","max_completion_tokens":50,"messages":[{"role":"user","content":"Say hello"}]}`
	req, _ := http.NewRequest(http.MethodPost, api.URL+"/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer sk-example")
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	var reply struct {
		Choices []struct{ Message struct{ Content string } }
	}
	_ = json.NewDecoder(resp.Body).Decode(&reply)
	resp.Body.Close() // reconciles the charge with the usage
	fmt.Println(resp.Status, reply.Choices[0].Message.Content)
	st := tr.Stats()
	fmt.Printf("sent %d; charged %g request, %g tokens; refunded %g tokens\n",
		st.Sent, st.Charged[bucket.Requests], st.Charged[bucket.Tokens], st.Refunded[bucket.Tokens])
	// Output:
	// 200 OK Lorem ipsum dolor si
	// sent 1; charged 1 request, 57 tokens; refunded 1 tokens
}

// ExampleAnthropic is ExampleOpenAI for Anthropic's Messages API, as
// anthropic-sdk-go (v2) sends it: the preset charges input tokens
// estimated and output tokens at max_tokens, and reconciles each with the
// usage.
func ExampleAnthropic() {
	api := llmtest.NewServer(llmtest.Config{ReplyTokens: 5}) // or https://api.anthropic.com
	defer api.Close()

	b := bucket.NewLocal(bucket.PerMinute(50), bucket.WithLimit(bucket.InputTokens, bucket.PerMinute(30_000)),
		bucket.WithLimit(bucket.OutputTokens, bucket.PerMinute(8_000)))
	tr := transport.New(nil, llmclient.Anthropic(b), transport.WithMaxWait(time.Minute))
	hc := &http.Client{Transport: tr}

	body := `{"model":"claude-sonnet-4-6","max_tokens":50,"messages":[{"role":"user","content":"Say hello"}]}`
	req, _ := http.NewRequest(http.MethodPost, api.AnthropicURL+"/v1/messages", strings.NewReader(body))
	req.Header.Set("X-Api-Key", "sk-ant-example")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	var reply struct{ Content []struct{ Text string } }
	_ = json.NewDecoder(resp.Body).Decode(&reply)
	resp.Body.Close() // reconciles the charge with the usage
	fmt.Println(resp.Status, reply.Content[0].Text)
	st := tr.Stats()
	fmt.Printf("sent %d; charged %g request, %g input and %g output tokens; refunded %g input and %g output tokens\n",
		st.Sent, st.Charged[bucket.Requests], st.Charged[bucket.InputTokens], st.Charged[bucket.OutputTokens],
		st.Refunded[bucket.InputTokens], st.Refunded[bucket.OutputTokens])
	// Output:
	// 200 OK Lorem ipsum dolor si
	// sent 1; charged 1 request, 7 input and 50 output tokens; refunded 1 input and 45 output tokens
}
