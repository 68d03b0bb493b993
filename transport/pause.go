package transport

import (
	"sync"
	"sync/atomic"
	"time"
)

// pauses holds, per key, the pause a 429 or 503 asked for with
// Retry-After: from when this process learnt of it until when it sends
// nothing on the key. It is safe for concurrent use; the common case, no
// pause at all, takes no lock.
type pauses struct {
	n  atomic.Int64 // len(m)
	mu sync.Mutex
	m  map[string]pause
}

// pause is a key's pause in this process. It is kept for as long again
// after it ends: a slot reserved before it began and due after it is
// shifted by its length (see Transport.held).
type pause struct {
	start, until time.Time
}

// length is how long p holds a key back.
func (p pause) length() time.Duration { return p.until.Sub(p.start) }

// get returns key's pause at now, if it has one or had one recently enough
// to matter (now before until + length).
func (p *pauses) get(key string, now time.Time) (pause, bool) {
	if p.n.Load() == 0 {
		return pause{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ps, ok := p.m[key]
	if !ok {
		return pause{}, false
	}
	if !ps.until.Add(ps.length()).After(now) {
		delete(p.m, key)
		p.n.Store(int64(len(p.m)))
		return pause{}, false
	}
	return ps, true
}

// until returns the end of key's pause, or the zero time if it is not
// paused at now.
func (p *pauses) until(key string, now time.Time) time.Time {
	if ps, ok := p.get(key, now); ok && ps.until.After(now) {
		return ps.until
	}
	return time.Time{}
}

// pause holds key back from now until t: a pause still running is
// extended, if t is later; otherwise a new one begins.
func (p *pauses) pause(key string, t, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[string]pause)
	}
	if old, ok := p.m[key]; ok && old.until.After(now) {
		if t.After(old.until) {
			p.m[key] = pause{old.start, t}
		}
		return
	}
	if len(p.m) >= 1024 { // forget pauses that no longer matter
		for k, ps := range p.m {
			if !ps.until.Add(ps.length()).After(now) {
				delete(p.m, k)
			}
		}
	}
	p.m[key] = pause{now, t}
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
