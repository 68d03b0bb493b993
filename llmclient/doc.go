// Package llmclient holds sluice's presets for LLM APIs: OpenAI(b) for an
// OpenAI-compatible API and Anthropic(b) for Anthropic's Messages API,
// each the transport options that key a call by its host, API key
// (hashed) and model, charge it its estimated tokens (RequestCost,
// AnthropicCost) and reconcile the charge with the usage its response
// reports (MeterOpenAIUsage, MeterUsage). Put a preset in the http.Client
// of the provider's official SDK, with the SDK's own retries off:
//
//	hc := &http.Client{Transport: transport.New(nil, llmclient.OpenAI(b))}
//	client := openai.NewClient(option.WithHTTPClient(hc), option.WithMaxRetries(0))
//
// It is also an OpenAI-compatible chat completions client of its own (New,
// with Chat and ChatStream) that shares the same limits.
// llmclient/llmtest is a fake rate-limited LLM server for tests.
package llmclient
