package bucket

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// windowsSeen is what a process has seen of its keys' windows (WithWindow)
// on Redis: by key, each window's tokens as the last reserve script's reply
// left them, and the life of the hash they were read from. It is how a
// window outlives the Redis that holds it:
//
//   - A window whose hash Redis made anew (a restart, a flush, a failover
//     that lost it) reads full, and would hand the fleet its whole burst
//     again, a day's for a daily window. A reply whose life is newer than
//     the one seen says so: the process lowers the window to what it saw
//     it hold, refilled since, less what the reply took (keepWindows). Each
//     process that sees the new life lowers it so: the window keeps the
//     least of them, and what the fleet took from it in between, at most
//     a round trip's calls.
//   - A fail-open share starts each window at its part of what this
//     process saw it hold, refilled since (tokens), not at its part of a
//     full window.
//
// What a process saw is at least what the window holds: the others only
// took from it since, or refunded (which a lowering forgets, erring toward
// the limit). A window that has refilled to its burst says nothing a full
// one would not: its entry goes once the record has doubled since the last
// sweep. Safe for concurrent use.
type windowsSeen struct {
	dims  []dim
	n     atomic.Int64 // len(seen): a bucket with no window pays no lock
	mu    sync.Mutex
	seen  map[string][]windowSaw // by key, by dimension (windows only)
	sweep int                    // len(seen) at which full entries are next forgotten

	// lower lowers key's windows to the amounts in to (lowerScript).
	lower func(ctx context.Context, key string, to Cost) error
}

// windowSaw is a window's tokens, as a reply read at at gave them, from
// the hash of life life. A zero windowSaw is not seen.
type windowSaw struct {
	tokens float64
	life   int64
	at     time.Time
}

// minWindowSweep is the least record swept for full windows.
const minWindowSweep = 64

func newWindowsSeen(dims []dim) *windowsSeen {
	return &windowsSeen{dims: dims, seen: map[string][]windowSaw{}, sweep: minWindowSweep}
}

// charged returns how many windows cost charges: those a reserve script
// replies about, in order.
func (w *windowsSeen) charged(cost Cost) int {
	n := 0
	for _, d := range w.dims {
		if d.window() && cost[d.of] != 0 {
			n++
		}
	}
	return n
}

// refilled is what saw holds at now: its tokens refilled at d's rate up to
// its burst since it was seen.
func (d dim) refilled(saw windowSaw, now time.Time) float64 {
	return min(d.limit.Burst, saw.tokens+max(now.Sub(saw.at).Seconds(), 0)*d.limit.Rate)
}

// keep records what the reply to a reservation of cost from key said of
// its windows, ws, as of now, and returns the windows to lower: those
// whose hash is newer than the one seen, to what was seen of them
// refilled since, less what the reservation took (taken).
func (w *windowsSeen) keep(key string, cost Cost, ws []windowReply, taken bool, now time.Time) Cost {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen, ok := w.seen[key]
	if !ok {
		seen = make([]windowSaw, len(w.dims))
	}
	var lower Cost
	j := 0
	for i, d := range w.dims {
		if !d.window() || cost[d.of] == 0 {
			continue
		}
		r, saw := ws[j], seen[i]
		j++
		// As a window can hold: a reply that says more (a proxy's, a
		// server's bug) must not outlast Redis in this process.
		r.tokens = min(max(r.tokens, -d.limit.Burst), d.limit.Burst)
		switch {
		case saw.at.IsZero():
		case r.life < saw.life:
			continue // a reply older than the one seen
		case r.life > saw.life:
			to := d.refilled(saw, now)
			if taken {
				to -= cost[d.of]
			}
			if r.tokens > to {
				if lower == nil {
					lower = Cost{}
				}
				lower[d.name] = to
				// Seen of the old life still: the next reply, which finds
				// the window lowered, records the new one; or lowers it
				// again if this lowering failed.
				seen[i].tokens, seen[i].at = to, now
				continue
			}
		}
		seen[i] = windowSaw{tokens: r.tokens, life: r.life, at: now}
	}
	if !ok {
		w.seen[key] = seen
		w.n.Store(int64(len(w.seen)))
		if len(w.seen) >= w.sweep {
			w.forgetFull(now)
		}
	}
	return lower
}

// forgetFull forgets the keys whose windows have all refilled to their
// bursts, and sets the next sweep. w.mu must be held.
func (w *windowsSeen) forgetFull(now time.Time) {
	for key, seen := range w.seen {
		full := true
		for i, d := range w.dims {
			if d.window() && !seen[i].at.IsZero() && d.refilled(seen[i], now) < d.limit.Burst {
				full = false
				break
			}
		}
		if full {
			delete(w.seen, key)
		}
	}
	w.n.Store(int64(len(w.seen)))
	w.sweep = max(minWindowSweep, 2*len(w.seen))
}

// tokens returns what this process saw of key's windows, by window,
// refilled up to now; false if it saw none.
func (w *windowsSeen) tokens(key string, now time.Time) (Cost, bool) {
	if w == nil || w.n.Load() == 0 {
		return nil, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	seen, ok := w.seen[key]
	if !ok {
		return nil, false
	}
	c := Cost{}
	for i, d := range w.dims {
		if d.window() && !seen[i].at.IsZero() {
			c[d.name] = d.refilled(seen[i], now)
		}
	}
	return c, len(c) > 0
}

// keepWindows is windowsSeen.keep for a reply to a reservation of cost
// from key, lowering the windows Redis made anew. A lowering that failed
// is made again by the next reply, which finds the window new still.
func (s *scripted) keepWindows(ctx context.Context, key string, cost Cost, ws []windowReply, taken bool) {
	w := s.fo.windows
	if lower := w.keep(key, cost, ws, taken, s.fo.clock.Now()); lower != nil {
		_ = w.lower(ctx, key, lower)
	}
}

// windowsCharged is how many windows a reserve script's reply about a
// reservation of cost gives (see reserveScript): none but the token
// bucket's.
func (s *scripted) windowsCharged(cost Cost) int {
	if s.fo.windows == nil {
		return 0
	}
	return s.fo.windows.charged(cost)
}
