// Package llmfixture is what the llmclient tests share, in the library's
// module and in compat's: a bucket whose clock never moves, the Transport
// an openai-go user puts in front of an API, and an llmtest server.
package llmfixture

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
)

// Frozen is a bucket clock that never moves: nothing refills, so that a
// test reads exactly what was charged and reconciled.
type Frozen struct{}

// Now implements bucket.Clock.
func (Frozen) Now() time.Time { return time.Unix(1_800_000_000, 0) }

// Limits of the test buckets.
const (
	RPM = 100
	TPM = 10_000
)

// Key is the bucket key of the tests that set one.
const Key = "k"

// Bucket returns a frozen bucket of RPM requests and TPM tokens.
func Bucket() *bucket.Local {
	return bucket.NewLocal(bucket.PerMinute(RPM),
		bucket.WithLimit(bucket.Tokens, bucket.PerMinute(TPM)), bucket.WithClock(Frozen{}))
}

// Spent returns what Key has spent of b, a Bucket's, per dimension.
func Spent(b *bucket.Local) bucket.Cost {
	tok := b.Tokens(Key)
	return bucket.Cost{bucket.Requests: RPM - tok[bucket.Requests], bucket.Tokens: TPM - tok[bucket.Tokens]}
}

// Transport is what an http.Client user (or openai-go's) puts in front of
// an LLM API: a Transport on b, keyed Key, that charges the estimate and
// reconciles it.
func Transport(b bucket.Bucket) *transport.Transport {
	return transport.New(nil,
		transport.WithBucket(b),
		transport.WithKey(func(*http.Request) string { return Key }),
		transport.WithCost(llmclient.RequestCost(nil)),
		transport.WithUsage(llmclient.MeterUsage),
	)
}

// Server starts an llmtest server with no limits and replies of 10 tokens,
// closed when t ends.
func Server(t testing.TB) *llmtest.Server {
	t.Helper()
	s := llmtest.NewServer(llmtest.Config{ReplyTokens: 10})
	t.Cleanup(s.Close)
	return s
}

// The request "Say hello" of 9 characters capped at 100 tokens:
// llmclient.Estimate makes it ⌈9/4⌉ + 4 + 100 = 107 tokens; llmtest
// answers ⌈9/4⌉ + 3 + 10 = 16.
const (
	HelloEstimate = 107
	HelloUsage    = 16
	// HelloCharged is what the OpenAI preset reckons hello at: its
	// prompt_tokens (6) and its cap (100), as OpenAI counts it.
	HelloCharged = 106
)
