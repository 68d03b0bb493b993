// Package transport is sluice's http.RoundTripper: it waits on a shared
// bucket before every attempt, retries what is safe to retry, honours the
// provider's Retry-After, and stops calling a broken upstream.
package transport
