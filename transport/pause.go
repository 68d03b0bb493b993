package transport

import (
	"sync"
	"sync/atomic"
	"time"
)

// pauses holds, per key, the end of the pause a 429 or 503 asked for with
// Retry-After: until then this process sends nothing on the key. It is
// safe for concurrent use; the common case, no pause at all, takes no lock.
type pauses struct {
	n  atomic.Int64 // len(m)
	mu sync.Mutex
	m  map[string]time.Time
}

// until returns the end of key's pause, or the zero time if it is not
// paused at now.
func (p *pauses) until(key string, now time.Time) time.Time {
	if p.n.Load() == 0 {
		return time.Time{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.m[key]
	if !ok {
		return time.Time{}
	}
	if !t.After(now) {
		delete(p.m, key)
		p.n.Store(int64(len(p.m)))
		return time.Time{}
	}
	return t
}

// pause holds key back until t, or longer if it is already.
func (p *pauses) pause(key string, t, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[string]time.Time)
	}
	if old, ok := p.m[key]; ok && !t.After(old) {
		return
	}
	if len(p.m) >= 1024 { // forget pauses that are over
		for k, u := range p.m {
			if !u.After(now) {
				delete(p.m, k)
			}
		}
	}
	p.m[key] = t
	p.n.Store(int64(len(p.m)))
}

// refundTimeout bounds the bucket calls made after the caller's context may
// have ended: refunds and observations.
const refundTimeout = 2 * time.Second

// observeEvery is how often, at most, a Transport tells the bucket what
// accepted responses of one key report about the quota: each is one more
// call to a shared bucket, and successive reports mostly say the same.
const observeEvery = 50 * time.Millisecond

// sampler lets through one observation per key every observeEvery. It is
// safe for concurrent use.
type sampler struct {
	mu   sync.Mutex
	next map[string]time.Time
}

// due reports whether key's next observation is due at now, and if so
// schedules the one after.
func (s *sampler) due(key string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.next[key]; ok && now.Before(t) {
		return false
	}
	if s.next == nil || len(s.next) >= 1024 {
		s.next = make(map[string]time.Time) // forget: at worst one more call per key
	}
	s.next[key] = now.Add(observeEvery)
	return true
}
