package llmclient_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
)

// The helpers of sluice's llmclient tests that TestOpenAIGo uses.

// frozen is a bucket clock that never moves: nothing refills, so that a
// test reads exactly what was charged and reconciled.
type frozen struct{}

func (frozen) Now() time.Time { return time.Unix(1_800_000_000, 0) }

// Limits of the test buckets.
const (
	testRPM = 100
	testTPM = 10_000
)

// newBucket returns a frozen bucket of testRPM requests and testTPM
// tokens.
func newBucket() *bucket.Local {
	return bucket.NewLocal(bucket.PerMinute(testRPM),
		bucket.WithLimit(bucket.Tokens, bucket.PerMinute(testTPM)), bucket.WithClock(frozen{}))
}

// key is the bucket key of the tests.
const key = "k"

// spent returns what key has spent of b, per dimension.
func spent(b *bucket.Local) bucket.Cost {
	tok := b.Tokens(key)
	return bucket.Cost{bucket.Requests: testRPM - tok[bucket.Requests], bucket.Tokens: testTPM - tok[bucket.Tokens]}
}

// newTransport is what an http.Client user (or openai-go's) puts in front
// of an LLM API: a Transport that charges the estimate and reconciles it.
func newTransport(b bucket.Bucket) *transport.Transport {
	return transport.New(nil,
		transport.WithBucket(b),
		transport.WithKey(func(*http.Request) string { return key }),
		transport.WithCost(llmclient.RequestCost(nil)),
		transport.WithUsage(llmclient.MeterUsage),
	)
}

// newLLM starts an llmtest server with no limits and replies of 10 tokens.
func newLLM(t *testing.T) *llmtest.Server {
	t.Helper()
	s := llmtest.NewServer(llmtest.Config{ReplyTokens: 10})
	t.Cleanup(s.Close)
	return s
}

// The request of TestOpenAIGo is 9 characters capped at 100 tokens:
// llmclient.Estimate makes it ⌈9/4⌉ + 4 + 100 = 107 tokens; llmtest
// answers ⌈9/4⌉ + 3 + 10 = 16.
const (
	helloEstimate = 107
	helloUsage    = 16
)
