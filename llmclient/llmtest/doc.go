// Package llmtest is a fake OpenAI chat completions and Anthropic Messages API with a
// hidden rate limit on requests and tokens, like httptest for code that
// calls LLM APIs: it answers 429 with Retry-After beyond its limit (or, as
// Gemini does, with nothing but a RetryInfo in the body), reports quota in
// OpenAI, Anthropic or IETF headers, reads time from an injectable clock so
// that tests decide every admission, and counts what it admitted so that
// tests can check a client kept to the limit.
//
// Its Messages API counts as Anthropic does (see Handler): input and output
// tokens under limits of their own (Config.InputTokens, OutputTokens), the
// input at admission (MessageInputTokens: characters/4, plus 3 a message),
// the output as max_tokens at admission, less what the reply leaves unused
// once it is written; it refuses with Anthropic's rate_limit_error and a
// Retry-After in whole seconds, and with AnthropicHeaders reports every
// limit in anthropic-ratelimit-* headers, tokens-* the most restrictive of
// the token limits.
package llmtest
