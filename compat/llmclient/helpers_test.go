package llmclient_test

import "github.com/sluicehq/sluice/internal/llmfixture"

// The fixtures of sluice's llmclient tests that TestOpenAIGo uses.

var (
	newBucket    = llmfixture.Bucket
	spent        = llmfixture.Spent
	newTransport = llmfixture.Transport
	newLLM       = llmfixture.Server
)

// What TestOpenAIGo's request, "Say hello" capped at 100 tokens, is
// estimated and reported to take.
const (
	helloEstimate = llmfixture.HelloEstimate
	helloUsage    = llmfixture.HelloUsage
)
