// Package bucket is the shared quota of a fleet: rate limits decided in one
// place (Redis, or this process) that every worker charges before it calls
// an upstream API. Redis and Local are token buckets; FixedWindow and
// SlidingLog count over windows, for providers that enforce limits that way.
// InFlight and LocalInFlight bound the calls in flight at once instead.
package bucket
