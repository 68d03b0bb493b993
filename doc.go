// Package sluice throttles a program's outbound calls to an API (LLM APIs
// first) so that a fleet of processes on many machines shares one quota
// and stays inside the provider's limits. It has no API of its own: this
// is the map of the packages.
//
// Start with a preset. llmclient.OpenAI(b) and llmclient.Anthropic(b) are
// the transport options for OpenAI-compatible APIs and for Anthropic's
// Messages API: each call is keyed by its host, a fingerprint of its API
// key and its model, charged its estimated tokens before it is sent, and
// reconciled with the usage its response reports. Put them in a
// transport.New, in the http.Client of the provider's official SDK (with
// the SDK's own retries off: sluice retries, through the bucket):
//
//	b := bucket.NewRedis(rdb, bucket.PerMinute(500), bucket.WithLimit(bucket.Tokens, bucket.PerMinute(200_000)))
//	hc := &http.Client{Transport: transport.New(nil, llmclient.OpenAI(b), transport.WithMaxWait(time.Minute))}
//	client := openai.NewClient(option.WithHTTPClient(hc), option.WithMaxRetries(0))
//
// The packages:
//
//   - bucket: the shared quota. NewRedis keeps it in Redis for a fleet
//     (fail-open to this process's share while Redis is down); NewLocal
//     keeps it in one process. Limits per dimension (requests, tokens,
//     input and output tokens), per-model plans (Route), daily windows.
//   - transport: the http.RoundTripper that waits on the bucket before each
//     attempt, honours Retry-After, retries what is safe through the
//     bucket, and reads the provider's rate-limit headers.
//   - llmclient: the presets (OpenAI, Anthropic), token estimates and usage
//     reconciliation, and a small chat client of its own (New);
//     llmclient/llmtest is a fake rate-limited LLM server for tests.
//   - adaptive: how responses are read (Parse: 429s, Retry-After, quota
//     headers) and the law by which a key's rate adapts (Policy).
//
// Constructors panic on a programmer's error only, at construction: an
// option given to a constructor that cannot honour it, or an invalid
// Limit (see bucket.NewLocal, bucket.NewRedis, transport.New). Errors that
// depend on input (a cost above the burst, a deadline too near, a
// misconfigured Redis) are returned.
//
// The README states the guarantees; docs/reference.md details every
// option.
package sluice
