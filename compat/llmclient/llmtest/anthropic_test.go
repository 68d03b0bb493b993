package llmtest_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/llmclient/llmtest"
)

func newAnthropic(srv *llmtest.Server) anthropic.Client {
	return anthropic.NewClient(option.WithBaseURL(srv.AnthropicURL), option.WithAPIKey("sk-ant-test"), option.WithMaxRetries(0))
}

func messageParams() anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     "claude-test",
		MaxTokens: 5,
		System:    []anthropic.TextBlockParam{{Text: "Be brief."}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))},
	}
}

// inputTokens is what the fake counts for messageParams: ⌈19/4⌉ + 3.
const inputTokens = 8

func TestAnthropicClientParsesMessage(t *testing.T) {
	srv := llmtest.NewServer(llmtest.Config{ReplyTokens: 8})
	defer srv.Close()
	client := newAnthropic(srv)
	m, err := client.Messages.New(context.Background(), messageParams())
	require.NoError(t, err)
	assert.Equal(t, "claude-test", m.Model)
	require.Len(t, m.Content, 1)
	assert.Equal(t, "Lorem ipsum dolor si", m.Content[0].Text)
	assert.Equal(t, anthropic.StopReasonMaxTokens, m.StopReason)
	assert.EqualValues(t, inputTokens, m.Usage.InputTokens)
	assert.EqualValues(t, 5, m.Usage.OutputTokens)
}

func TestAnthropicClientParsesStream(t *testing.T) {
	srv := llmtest.NewServer(llmtest.Config{ReplyTokens: 3})
	defer srv.Close()
	client := newAnthropic(srv)
	stream := client.Messages.NewStreaming(context.Background(), messageParams())
	var acc anthropic.Message
	var deltas []string
	for stream.Next() {
		ev := stream.Current()
		require.NoError(t, acc.Accumulate(ev))
		if d, ok := ev.AsAny().(anthropic.ContentBlockDeltaEvent); ok {
			deltas = append(deltas, d.Delta.Text)
		}
	}
	require.NoError(t, stream.Err())
	require.NoError(t, stream.Close())
	assert.Equal(t, []string{"Lore", "m ip", "sum "}, deltas)
	require.Len(t, acc.Content, 1)
	assert.Equal(t, "Lorem ipsum ", acc.Content[0].Text)
	assert.Equal(t, anthropic.StopReasonEndTurn, acc.StopReason)
	assert.EqualValues(t, inputTokens, acc.Usage.InputTokens)
	assert.EqualValues(t, 3, acc.Usage.OutputTokens)
}

func TestAnthropicClientReadsRateLimitError(t *testing.T) {
	srv := llmtest.NewServer(llmtest.Config{ReplyTokens: 3, Headers: llmtest.AnthropicHeaders,
		OutputTokens: llmtest.TokenBucket(6, time.Minute, 6)})
	defer srv.Close()
	client := newAnthropic(srv)
	_, err := client.Messages.New(context.Background(), messageParams())
	require.NoError(t, err)
	_, err = client.Messages.New(context.Background(), messageParams()) // 3 left of 6; max_tokens 5
	var apiErr *anthropic.Error
	require.True(t, errors.As(err, &apiErr), "%v", err)
	assert.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
	assert.EqualValues(t, "rate_limit_error", apiErr.Type())
	assert.Equal(t, "20", apiErr.Response.Header.Get("Retry-After"), "2 tokens at 0.1/s")
	assert.Equal(t, "3", apiErr.Response.Header.Get("Anthropic-Ratelimit-Output-Tokens-Remaining"))
	assert.True(t, strings.Contains(err.Error(), "output tokens"), err.Error())
}
