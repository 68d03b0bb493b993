// Package dimension is the one home of the dimension names sluice itself
// uses: the keys of a bucket.Cost and of an adaptive.Feedback's Quotas.
// Users see them as bucket.Requests, bucket.Tokens, bucket.InputTokens and
// bucket.OutputTokens; adaptive, which bucket imports, reads responses
// into them.
package dimension

const (
	Requests     = "requests"
	Tokens       = "tokens"
	InputTokens  = "input_tokens"
	OutputTokens = "output_tokens"
)
