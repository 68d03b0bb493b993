package main

import (
	"math/rand/v2"
	"strings"

	"github.com/sluicehq/sluice/llmclient"
)

// The sizes of the jobs, in tokens (4 characters each): a prompt of
// minPrompt to maxPrompt tokens and a cap on the completion of
// minCompletion to maxCompletion, both uniform. A job costs about
// (20+800)/2 + 6 + (32+256)/2 ≈ 560 tokens on average.
const (
	minPrompt, maxPrompt         = 20, 800
	minCompletion, maxCompletion = 32, 256
)

// maxJobTokens bounds what one job is charged before it is sent
// (llmclient.Estimate: the prompt, the system prompt and 4 per message,
// the cap): the bucket's burst must hold it.
const maxJobTokens = maxPrompt + maxCompletion + 32

// systemPrompt is the first message of every job.
const systemPrompt = "Be brief."

// words make up the prompts.
var words = strings.Fields(`the quota fleet token bucket shares one limit across
processes and machines so that no worker eats a rate limit error while
others wait summarize translate review explain compare list draft answer
report customer invoice contract release note incident ticket paragraph`)

// job returns the chat request of job i of a run seeded with seed: the
// same for every process and every run with that seed.
func job(seed uint64, i int, model string) llmclient.ChatRequest {
	rng := rand.New(rand.NewPCG(seed, uint64(i)))
	prompt := minPrompt + rng.IntN(maxPrompt-minPrompt+1)
	completion := minCompletion + rng.IntN(maxCompletion-minCompletion+1)

	var b strings.Builder
	chars := 4 * prompt
	b.Grow(chars + 16)
	b.WriteString("Summarize:")
	for b.Len() < chars {
		b.WriteByte(' ')
		b.WriteString(words[rng.IntN(len(words))])
	}
	text := b.String()[:chars]

	return llmclient.ChatRequest{
		Model: model,
		Messages: []llmclient.Message{
			{Role: "system", Content: systemPrompt},
			{Role: "user", Content: text},
		},
		MaxTokens: completion,
	}
}
