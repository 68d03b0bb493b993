// Package compat has no API. Its module holds sluice's tests and
// benchmarks that import third-party libraries a user of sluice need not
// have: the official openai-go client sending through sluice, and
// go-retryablehttp, go-redis/redis_rate and golang.org/x/time/rate measured
// against it. Each directory holds the tests of the sluice package of the
// same path; they use only sluice's exported API and its internal test
// helpers. internal/reserveloop is the loop whose instructions callgrind
// counts beside x/time/rate's (docs/performance.md).
package compat
