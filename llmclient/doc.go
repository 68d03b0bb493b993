// Package llmclient is an OpenAI-compatible chat completions client that
// shares its provider's request and token limits through a sluice bucket,
// and the pieces that give the official openai-go client the same:
// RequestCost, which estimates a request's tokens, and MeterUsage, which
// reconciles the estimate with the usage the response reports.
package llmclient
