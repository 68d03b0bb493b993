// Package fakeapi is a fake rate-limited HTTP API for sluice's own tests: a
// token-bucket limiter that answers 429 with Retry-After beyond its limit,
// and a minimal OpenAI-compatible chat completions endpoint.
package fakeapi

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Limiter is an http.Handler that admits requests at Rate per second with a
// burst of Burst (a token bucket that starts full) and passes them to the
// next handler; beyond the limit it answers 429 with Retry-After (whole
// seconds, rounded up) and retry-after-ms, and an OpenAI-style error body.
// Limiter is safe for concurrent use.
type Limiter struct {
	rate, burst float64
	next        http.Handler

	mu     sync.Mutex
	tokens float64
	last   time.Time
	stats  Stats
}

// Stats counts what a Limiter has seen.
type Stats struct {
	Requests int64     // every request received
	Rejected int64     // requests answered 429
	First    time.Time // arrival of the first request
	Last     time.Time // arrival of the last admitted request
}

// NewLimiter returns a Limiter in front of next; a nil next answers 200 "ok".
func NewLimiter(rate, burst float64, next http.Handler) *Limiter {
	if next == nil {
		next = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			fmt.Fprint(w, "ok")
		})
	}
	return &Limiter{rate: rate, burst: burst, next: next, tokens: burst, last: time.Now()}
}

// ServeHTTP implements http.Handler.
func (l *Limiter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ok, wait := l.take(time.Now())
	if !ok {
		ms := int64(math.Ceil(float64(wait) / float64(time.Millisecond)))
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(wait.Seconds())), 10))
		w.Header().Set("Retry-After-Ms", strconv.FormatInt(ms, 10))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`)
		return
	}
	l.next.ServeHTTP(w, r)
}

// take takes one token at now, or says how long until one exists.
func (l *Limiter) take(now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stats.Requests++
	if l.stats.First.IsZero() {
		l.stats.First = now
	}
	if el := now.Sub(l.last).Seconds(); el > 0 {
		l.tokens = min(l.burst, l.tokens+el*l.rate)
		l.last = now
	}
	if l.tokens >= 1 {
		l.tokens--
		l.stats.Last = now
		return true, 0
	}
	l.stats.Rejected++
	return false, time.Duration((1 - l.tokens) / l.rate * float64(time.Second))
}

// Stats returns what l has seen so far.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}
