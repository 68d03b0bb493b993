// Package proxy is sluice proxy: an HTTP proxy in front of LLM providers
// through which any language's official SDK, by its base URL, shares the
// fleet's quota. It is a user of sluice's transport, bucket and llmclient
// presets: the waiting, retries, adaptation and reconciliation are theirs.
package proxy
