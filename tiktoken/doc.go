// Package tiktoken estimates the tokens of an OpenAI chat completion
// request with the model's own tokenizer (o200k_base or cl100k_base, from
// github.com/tiktoken-go/tokenizer, whose vocabularies are compiled into
// the binary: nothing is downloaded or cached at run time), where
// llmclient.Estimate divides characters by 4. It is a module of its own so
// that sluice's core does not carry the vocabularies (about 10 MB of the
// binary). Anthropic publishes no tokenizer for its current models: keep
// llmclient.AnthropicCost for them.
package tiktoken
