package main

import (
	"bytes"
	"flag"
	"io"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/llmclient/llmtest"
)

var (
	usageLine  = regexp.MustCompile(`(?m)^  usage: (\d+) prompt \+ (\d+) completion = (\d+) tokens$`)
	bucketLine = regexp.MustCompile(`(?m)^  bucket: charged 1 request and (\d+) tokens, reconciled ([+-]\d+) tokens: (\d+) tokens spent$`)
)

// checkOutput checks that both calls printed their usage and that the
// bucket reconciled each charge to the prompt's tokens and maxTokens, as
// OpenAI counts, and returns the tokens spent.
func checkOutput(t *testing.T, out string, maxTokens int) int {
	t.Helper()
	usages, buckets := usageLine.FindAllStringSubmatch(out, -1), bucketLine.FindAllStringSubmatch(out, -1)
	require.Len(t, usages, 2, out)
	require.Len(t, buckets, 2, out)
	assert.Regexp(t, `(?m)^completion: \S`, out)
	assert.Regexp(t, `(?m)^stream: \S`, out)
	total := 0
	for i := range 2 {
		used, charged, adjusted, spent := atoi(t, usages[i][3]), atoi(t, buckets[i][1]), atoi(t, buckets[i][2]), atoi(t, buckets[i][3])
		assert.Equal(t, atoi(t, usages[i][1])+atoi(t, usages[i][2]), used)
		counted := atoi(t, usages[i][1]) + maxTokens
		assert.Equal(t, counted, charged+adjusted, "reconciled to the prompt and the cap")
		assert.Equal(t, counted, spent)
		total += spent
	}
	return total
}

func TestRun(t *testing.T) {
	t.Run("in-process fake", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		require.NoError(t, run(t.Context(), nil, &stdout, &stderr))
		assert.Empty(t, stderr.String())
		assert.Contains(t, stdout.String(), "(in-process fake API)")
		checkOutput(t, stdout.String(), 64)
	})
	t.Run("base URL", func(t *testing.T) {
		api := llmtest.NewServer(llmtest.Config{ReplyTokens: 5, ChargeCap: true})
		defer api.Close()
		var stdout bytes.Buffer
		err := run(t.Context(), []string{"-base-url", api.URL, "-api-key", "sk-test", "-prompt", "Hi", "-max-tokens", "100"},
			&stdout, io.Discard)
		require.NoError(t, err)
		spent := checkOutput(t, stdout.String(), 100)
		assert.Contains(t, stdout.String(), "usage: 4 prompt + 5 completion = 9 tokens")
		assert.Contains(t, stdout.String(), "charged 1 request and 105 tokens, reconciled -1 tokens: 104 tokens spent")
		st := api.Stats()
		assert.EqualValues(t, 2, st.Accepted)
		assert.EqualValues(t, st.ChargedTokens, spent, "what the bucket kept is what the API counted")
	})
	t.Run("help keeps the API key out", func(t *testing.T) {
		t.Setenv("OPENAI_API_KEY", "sk-from-env")
		var stderr bytes.Buffer
		err := run(t.Context(), []string{"-h"}, io.Discard, &stderr)
		assert.ErrorIs(t, err, flag.ErrHelp)
		assert.Contains(t, stderr.String(), "-api-key")
		assert.NotContains(t, stderr.String(), "sk-from-env")
	})
	t.Run("bad flags", func(t *testing.T) {
		for want, args := range map[string][]string{
			"-max-tokens must be >= 1, got 0":     {"-max-tokens", "0"},
			"-rpm must be a number > 0, got -1":   {"-rpm", "-1"},
			"-tpm must be a number > 0, got +Inf": {"-tpm", "+Inf"},
			`unexpected argument "x"`:             {"x"},
		} {
			var stderr bytes.Buffer
			err := run(t.Context(), args, io.Discard, &stderr)
			assert.ErrorIs(t, err, errUsage)
			assert.Contains(t, stderr.String(), want)
			assert.Contains(t, stderr.String(), "Usage: openai")
		}
	})
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}
