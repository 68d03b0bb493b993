package llmclient_test

import (
	"cmp"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/llmclient"
)

// completion returns a Chat completion whose content is n bytes.
func completion(n int) string {
	return `{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("a", n) +
		`"},"finish_reason":"stop"}],"usage":{"total_tokens":16}}`
}

// assertTooLarge checks that err is a *TooLargeError of limit that names
// the option to raise it.
func assertTooLarge(t *testing.T, err error, limit int64) {
	t.Helper()
	var tl *llmclient.TooLargeError
	if assert.ErrorAs(t, err, &tl) {
		assert.Equal(t, limit, tl.Limit)
	}
	assert.ErrorIs(t, err, llmclient.ErrTooLarge)
	assert.ErrorContains(t, err, fmt.Sprint(limit))
	assert.ErrorContains(t, err, "WithMaxResponseBytes")
}

// TestChatBodyBounded: Chat read a 2xx body with an unbounded io.ReadAll
// (a 300 MB body took the heap to 774 MB). It reads at most 16 MiB, or
// what WithMaxResponseBytes says, and fails past it with a *TooLargeError.
func TestChatBodyBounded(t *testing.T) {
	const defaultLimit = 16 << 20
	big := completion(defaultLimit + 1<<20)
	srv := newRecorder(t, reply(200, big, "Content-Type", "application/json"))

	_, err := llmclient.New(srv.URL, "sk-test", llmclient.WithBucket(newBucket())).Chat(t.Context(), hello)
	assertTooLarge(t, err, defaultLimit)

	resp, err := llmclient.New(srv.URL, "sk-test", llmclient.WithBucket(newBucket()),
		llmclient.WithMaxResponseBytes(32<<20)).Chat(t.Context(), hello)
	require.NoError(t, err, "raised")
	assert.Len(t, resp.Choices[0].Message.Content, defaultLimit+1<<20)

	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{completion(100), true},
		{completion(1 << 10), false},
	} {
		srv := newRecorder(t, reply(200, tc.body, "Content-Type", "application/json"))
		_, err := llmclient.New(srv.URL, "sk-test", llmclient.WithBucket(newBucket()),
			llmclient.WithMaxResponseBytes(1<<10)).Chat(t.Context(), hello)
		if tc.ok {
			assert.NoError(t, err, "%d bytes", len(tc.body))
		} else {
			assertTooLarge(t, err, 1<<10)
		}
	}
}

// TestChatStreamEventBounded: one line of a stream was bounded (8 MiB), but
// not an event's data, which a stream of data lines with no blank line
// between grew without end. Both are bounded by WithMaxResponseBytes.
func TestChatStreamEventBounded(t *testing.T) {
	// One event, valid JSON, its data spread over lines of 1 KiB of spaces.
	spread := func(n int) string {
		var b strings.Builder
		b.WriteString("data: {\"choices\":[\n")
		for range n {
			b.WriteString("data: " + strings.Repeat(" ", 1<<10) + "\n")
		}
		b.WriteString("data: {\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n")
		return b.String()
	}
	for _, tc := range []struct {
		name  string
		body  string
		limit int64 // 0: the default
		ok    bool
	}{
		{"default: an event of 17 MiB of lines", spread(17 << 10), 0, false},
		{"raised: an event of 17 MiB of lines", spread(17 << 10), 32 << 20, true},
		{"an event of many lines", spread(4), 2 << 10, false},
		{"an event within the limit", spread(1), 2 << 10, true},
		{"a line too long", "data: {\"x\":\"" + strings.Repeat("a", 4<<10) + "\"}\n\ndata: [DONE]\n\n", 2 << 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newRecorder(t, reply(200, tc.body, "Content-Type", "text/event-stream"))
			c := llmclient.New(srv.URL, "sk-test", llmclient.WithBucket(newBucket()),
				llmclient.WithMaxResponseBytes(tc.limit))
			var got []string
			var gotErr error
			for chunk, err := range c.ChatStream(t.Context(), hello) {
				if err != nil {
					gotErr = err
					break
				}
				got = append(got, chunk.Choices[0].Delta.Content)
			}
			if tc.ok {
				assert.NoError(t, gotErr)
				assert.Equal(t, []string{"Hi"}, got)
				return
			}
			assertTooLarge(t, gotErr, cmp.Or(tc.limit, 16<<20))
			assert.Empty(t, got)
		})
	}
}
