// Package llmtest is a fake OpenAI-compatible chat completions server with a
// hidden rate limit on requests and tokens, like httptest for code that
// calls LLM APIs: it answers 429 with Retry-After beyond its limit (or, as
// Gemini does, with nothing but a RetryInfo in the body), reports quota in
// OpenAI, Anthropic or IETF headers, reads time from an injectable clock so
// that tests decide every admission, and counts what it admitted so that
// tests can check a client kept to the limit.
package llmtest
