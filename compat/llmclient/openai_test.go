package llmclient_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
)

// TestOpenAIGo checks that the official client, sending through a
// Transport with RequestCost and MeterUsage, has its calls charged the
// estimate and reconciled to the usage, plain and streamed.
func TestOpenAIGo(t *testing.T) {
	params := openai.ChatCompletionNewParams{
		Model:     "gpt-test",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
		MaxTokens: openai.Int(100),
	}
	newClient := func(t *testing.T) (openai.Client, *bucket.Local) {
		s := newLLM(t)
		b := newBucket()
		return openai.NewClient(
			option.WithBaseURL(s.URL),
			option.WithAPIKey("sk-test"),
			option.WithHTTPClient(&http.Client{Transport: newTransport(b)}),
			option.WithMaxRetries(0),
		), b
	}

	t.Run("completion", func(t *testing.T) {
		client, b := newClient(t)
		res, err := client.Chat.Completions.New(t.Context(), params)
		require.NoError(t, err)
		assert.EqualValues(t, helloUsage, res.Usage.TotalTokens)
		assert.Equal(t, bucket.Cost{bucket.Requests: 1, bucket.Tokens: helloUsage}, spent(b))
	})
	stream := func(t *testing.T, client openai.Client, p openai.ChatCompletionNewParams) (string, int64) {
		t.Helper()
		s := client.Chat.Completions.NewStreaming(t.Context(), p)
		var text strings.Builder
		var total int64
		for s.Next() {
			ch := s.Current()
			if len(ch.Choices) > 0 {
				text.WriteString(ch.Choices[0].Delta.Content)
			}
			total += ch.Usage.TotalTokens
		}
		require.NoError(t, s.Err())
		require.NoError(t, s.Close())
		return text.String(), total
	}
	t.Run("streamed, with usage", func(t *testing.T) {
		client, b := newClient(t)
		p := params
		p.StreamOptions.IncludeUsage = openai.Bool(true)
		text, total := stream(t, client, p)
		assert.NotEmpty(t, text)
		assert.EqualValues(t, helloUsage, total)
		assert.Equal(t, bucket.Cost{bucket.Requests: 1, bucket.Tokens: helloUsage}, spent(b))
	})
	t.Run("streamed, without usage", func(t *testing.T) {
		client, b := newClient(t)
		text, total := stream(t, client, params)
		assert.NotEmpty(t, text)
		assert.Zero(t, total)
		assert.Equal(t, bucket.Cost{bucket.Requests: 1, bucket.Tokens: helloEstimate}, spent(b),
			"no usage in the stream: the estimate stands")
	})
}
