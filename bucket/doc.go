// Package bucket is the shared quota of a fleet: token buckets decided in one
// place (Redis, or this process) that every worker charges before it calls an
// upstream API.
package bucket
