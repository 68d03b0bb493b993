package llmtest_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newOpenAI(srv *llmtest.Server) openai.Client {
	return openai.NewClient(option.WithBaseURL(srv.URL), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
}

func chatParams() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model: "gpt-4.1-mini",
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("Be brief."),
			openai.UserMessage("Say hello."),
		},
		MaxCompletionTokens: openai.Int(5),
	}
}

func TestOpenAIClientParsesCompletion(t *testing.T) {
	srv := llmtest.NewServer(llmtest.Config{ReplyTokens: 8})
	defer srv.Close()
	params := chatParams()
	prompt := llmtest.PromptTokens(llmtest.ChatRequest{Messages: []llmtest.Message{
		{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Say hello."},
	}})
	require.Equal(t, 11, prompt) // ⌈19/4⌉ + 2·3

	client := newOpenAI(srv)
	c, err := client.Chat.Completions.New(context.Background(), params)
	require.NoError(t, err)
	assert.Equal(t, "chat.completion", string(c.Object))
	assert.Equal(t, "gpt-4.1-mini", c.Model)
	require.Len(t, c.Choices, 1)
	assert.Equal(t, "Lorem ipsum dolor si", c.Choices[0].Message.Content)
	assert.Equal(t, "length", c.Choices[0].FinishReason)
	assert.EqualValues(t, prompt, c.Usage.PromptTokens)
	assert.EqualValues(t, 5, c.Usage.CompletionTokens)
	assert.EqualValues(t, prompt+5, c.Usage.TotalTokens)
}

func TestOpenAIClientParsesStream(t *testing.T) {
	srv := llmtest.NewServer(llmtest.Config{ReplyTokens: 8})
	defer srv.Close()
	params := chatParams()
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}

	client := newOpenAI(srv)
	stream := client.Chat.Completions.NewStreaming(context.Background(), params)
	var acc openai.ChatCompletionAccumulator
	var deltas []string
	for stream.Next() {
		chunk := stream.Current()
		require.True(t, acc.AddChunk(chunk))
		if len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" {
			deltas = append(deltas, chunk.Choices[0].Delta.Content)
		}
	}
	require.NoError(t, stream.Err())
	require.NoError(t, stream.Close())
	assert.Equal(t, []string{"Lore", "m ip", "sum ", "dolo", "r si"}, deltas)
	require.Len(t, acc.Choices, 1)
	assert.Equal(t, "Lorem ipsum dolor si", acc.Choices[0].Message.Content)
	assert.Equal(t, "length", acc.Choices[0].FinishReason)
	assert.EqualValues(t, 11, acc.Usage.PromptTokens)
	assert.EqualValues(t, 5, acc.Usage.CompletionTokens)
	assert.EqualValues(t, 16, acc.Usage.TotalTokens)
	assert.EqualValues(t, 16, srv.Stats().TotalTokens)
}

func TestOpenAIClientSeesRateLimit(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	srv := llmtest.NewServer(llmtest.Config{
		Tokens:  llmtest.FixedWindow(20, time.Minute),
		Headers: llmtest.OpenAIHeaders,
		Now:     func() time.Time { return now },
	})
	defer srv.Close()
	client := newOpenAI(srv)

	_, err := client.Chat.Completions.New(context.Background(), chatParams()) // 16 tokens
	require.NoError(t, err)
	_, err = client.Chat.Completions.New(context.Background(), chatParams())
	var apiErr *openai.Error
	require.True(t, errors.As(err, &apiErr), err)
	assert.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
	assert.Equal(t, "rate_limit_exceeded", apiErr.Code)
	assert.Equal(t, "tokens", apiErr.Type)
	assert.True(t, strings.HasPrefix(apiErr.Message, "Rate limit reached for tokens"), apiErr.Message)
	assert.Equal(t, "60", apiErr.Response.Header.Get("Retry-After"))
	assert.Equal(t, "4", apiErr.Response.Header.Get("X-Ratelimit-Remaining-Tokens"))
}
