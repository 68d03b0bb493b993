// Package transport is sluice's http.RoundTripper: it waits on a shared
// bucket before every attempt, retries what is safe to retry, honours the
// provider's Retry-After, and stops calling a broken upstream.
//
// For an LLM API, start from a preset: llmclient.OpenAI(b) or
// llmclient.Anthropic(b) is the set of options (bucket, key, cost, usage)
// for that API, and options given after it override its own:
//
//	tr := transport.New(nil, llmclient.OpenAI(b), transport.WithMaxWait(time.Minute))
//
// For another API, New(nil, WithBucket(b)) keys each call by its host
// (HostKey), or by host and API key (WithKey(CredentialKey)), and charges
// it one request; WithCost charges more. Stats returns what the calls were
// charged and given back.
package transport
