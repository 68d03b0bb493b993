package transport

import (
	"sync"
	"sync/atomic"
	"time"
)

// expiring maps keys to times, a time no later than now being as good as
// none: such entries are forgotten, all at once, when the map has doubled
// since they last were (and at minSweep entries at first), so that each
// set costs amortised O(1) however many keys are live. A sweep that
// leaves n entries comes after n more sets at least, and it costs O(2n).
// The zero value is empty; it is not safe for concurrent use.
type expiring struct {
	m       map[string]time.Time
	sweepAt int // len(m) at which entries no later than now are forgotten
}

// minSweep is the least size of an expiring map at which it is swept.
const minSweep = 1024

// get returns key's time if it is after now, and forgets it if not.
func (e *expiring) get(key string, now time.Time) (time.Time, bool) {
	t, ok := e.m[key]
	if !ok {
		return time.Time{}, false
	}
	if !t.After(now) {
		delete(e.m, key)
		return time.Time{}, false
	}
	return t, true
}

// set sets key's time to t.
func (e *expiring) set(key string, t, now time.Time) {
	if e.m == nil {
		e.m, e.sweepAt = make(map[string]time.Time), minSweep
	}
	if len(e.m) >= e.sweepAt {
		for k, u := range e.m {
			if !u.After(now) {
				delete(e.m, k)
			}
		}
		e.sweepAt = max(minSweep, 2*len(e.m))
	}
	e.m[key] = t
}

// pauses holds, per key, the end of the pause a 429 or 503 asked for with
// Retry-After: until then this process sends nothing on the key. It is
// safe for concurrent use; the common case, no pause at all, takes no lock.
type pauses struct {
	n  atomic.Int64 // len(m.m)
	mu sync.Mutex
	m  expiring
}

// until returns the end of key's pause, or the zero time if it is not
// paused at now.
func (p *pauses) until(key string, now time.Time) time.Time {
	if p.n.Load() == 0 {
		return time.Time{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t, _ := p.m.get(key, now)
	p.n.Store(int64(len(p.m.m)))
	return t
}

// pause holds key back until t, or longer if it is already.
func (p *pauses) pause(key string, t, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.m.get(key, now); ok && !t.After(old) {
		return
	}
	p.m.set(key, t, now)
	p.n.Store(int64(len(p.m.m)))
}

// observeEvery is how often, at most, a Transport tells the bucket what
// accepted responses of one key report about the quota: each is one more
// call to a shared bucket, and successive reports mostly say the same.
const observeEvery = 50 * time.Millisecond

// sampler lets through one observation per key every observeEvery. It is
// safe for concurrent use.
type sampler struct {
	mu   sync.Mutex
	next expiring
}

// due reports whether key's next observation is due at now, and if so
// schedules the one after.
func (s *sampler) due(key string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.next.get(key, now); ok {
		return false
	}
	s.next.set(key, now.Add(observeEvery), now)
	return true
}
