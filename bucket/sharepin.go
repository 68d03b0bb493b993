package bucket

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// pins is what a process has seen of the fleet's pins (see NewRedis): by
// key, the limits Redis held it to below its own, by dimension. A fail-open
// share takes its part of these, not of the process's own limits: a
// process configured too high must not run at its own limit while Redis
// cannot hold it to the fleet's. A key's entry is read again at most every
// pinReadEvery while replies say the key is held, and goes once a reply
// says it is not; entries not read for pinForget go once the record has
// doubled since the last sweep. Safe for concurrent use.
type pins struct {
	n     atomic.Int64 // len(seen): most buckets have none, and pay no lock
	mu    sync.Mutex
	seen  map[string]pinSeen
	sweep int // len(seen) at which old entries are next forgotten
}

// pinSeen is a key's pinned limits, by dimension (this process's own
// where no lower one holds), as read at read.
type pinSeen struct {
	limits []Limit
	read   time.Time
}

const (
	// pinReadEvery is how often a key held lower has its pin read again.
	pinReadEvery = time.Second
	// pinForget is how long a pin not read again is kept: the longest
	// hold a pin has (see pinned in redis_lua.go), and as long again.
	pinForget = 2 * time.Minute
)

// of returns key's pinned limits, by dimension; nil if none is known.
func (p *pins) of(key string) []Limit {
	if p.n.Load() == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[key].limits
}

// due reports whether key's pin is to be read, as of now.
func (p *pins) due(key string, now time.Time) bool {
	if p.n.Load() == 0 {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.seen[key]
	return !ok || now.Sub(s.read) >= pinReadEvery
}

// set records key's pinned limits, read at now.
func (p *pins) set(key string, limits []Limit, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seen == nil {
		p.seen, p.sweep = make(map[string]pinSeen), minSweep
	}
	if _, ok := p.seen[key]; !ok && len(p.seen) >= p.sweep {
		for k, s := range p.seen {
			if now.Sub(s.read) > pinForget {
				delete(p.seen, k)
			}
		}
		p.sweep = max(minSweep, 2*len(p.seen))
	}
	p.seen[key] = pinSeen{limits: limits, read: now}
	p.n.Store(int64(len(p.seen)))
}

// unheld forgets key's pin: a reply said the key is not held lower.
func (p *pins) unheld(key string) {
	if p.n.Load() == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.seen, key)
	p.n.Store(int64(len(p.seen)))
}

// heldLower is what a process does when a reply says Redis holds key
// below its limits (held), or not: it warns, and it records the pin for
// its fail-open share, read at most every pinReadEvery.
func (s *scripted) heldLower(ctx context.Context, key string, held bool) {
	if !held {
		s.fo.pins.unheld(key)
		return
	}
	s.warnHeld()
	if !s.fo.open || !s.fo.pins.due(key, time.Now()) {
		return
	}
	if limits := s.readPins(ctx, key); limits != nil {
		s.fo.pins.set(key, limits, time.Now())
	}
}

// readPins reads key's pins (the fields cr and cb of each dimension's
// hash, see redis_lua.go) and returns the limits they set, by dimension:
// the lower of each pinned number and this process's own, which a number
// that is missing, malformed or out of a Limit's range leaves as it is
// (what Redis says is bounded before it is used). Windows keep their own.
// nil if the read failed.
func (s *scripted) readPins(ctx context.Context, key string) []Limit {
	names := s.names(key)
	cmds := make([]*redis.SliceCmd, len(s.dims))
	err := s.fo.call(ctx, s.fo.callTimeout(), func(ctx context.Context) error {
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range s.dims {
				cmds[i] = p.HMGet(ctx, names[1+i].(string), "cr", "cb")
			}
			return nil
		})
		return err
	})
	if err != nil {
		return nil
	}
	limits := make([]Limit, len(s.dims))
	for i, d := range s.dims {
		limits[i] = d.limit
		if d.window() {
			continue
		}
		v := cmds[i].Val()
		if len(v) != 2 {
			continue
		}
		limits[i].Rate = lowerPin(d.limit.Rate, v[0], minRate)
		limits[i].Burst = lowerPin(d.limit.Burst, v[1], minBurst)
	}
	return limits
}

// lowerPin returns the lower of own and v, a pinned number in millionths
// as Redis keeps it, if v is one from least up and within maxPinRatio of
// own (a pin further off is a configuration error the scripts ignore, see
// pinOne in redis_lua.go); else own.
func lowerPin(own float64, v any, least float64) float64 {
	str, ok := v.(string)
	if !ok {
		return own
	}
	u, err := strconv.ParseFloat(str, 64)
	if u /= 1e6; err != nil || !(u >= least) || own > u*maxPinRatio {
		return own
	}
	return min(own, u)
}

// maxPinRatio is how far below a process's own limit a pin may hold it,
// as the scripts' maxPinRatio (redis_lua.go).
const maxPinRatio = 1000
