package bucket

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// windowsSeen is what a process has seen of its keys' windows (WithWindow)
// on Redis: by key, each window's tokens as the last reply of a reserve or
// adjust script left them, and the life (i) of the hash they were read
// from. It is how a window outlives the Redis that holds it:
//
//   - A window whose hash Redis made anew (a restart, a flush, a failover
//     that lost it) reads full, and would hand the fleet its whole burst
//     again, a day's for a daily window. A reply of a hash of another life
//     than the one seen says so: the process lowers the window to what it
//     saw it hold, refilled since, less what the operation took
//     (keepWindows). Each process that sees the new life lowers it so: the
//     window keeps the least of them, and what the fleet took from it in
//     between, at most a round trip's calls. A window's hash that expired
//     is no such case: it lives two of its lengths after its last write
//     (store, in redis_lua.go), so it was full, and every record of it,
//     held to a burst's debt, has refilled to its burst since.
//   - A fail-open share starts each window at its part of what this
//     process saw it hold, refilled since (tokens), not at its part of a
//     full window.
//
// What a process saw is at least what the window holds, but for the
// refunds of other processes since, which a lowering forgets (erring
// toward the limit). A window that has refilled to its burst says nothing
// a full one would not: its entry goes once the record has doubled since
// the last sweep. Safe for concurrent use.
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

// windowAmount is what an operation took from a window, the dimension at
// index dim (a refund is negative): what a reply to it tells of.
type windowAmount struct {
	dim    int
	amount float64
}

// charged returns the windows a reservation of cost charges, in order
// (those a reserve script replies about), each with what it took if
// taken, else 0.
func (w *windowsSeen) charged(cost Cost, taken bool) []windowAmount {
	var ws []windowAmount
	for i, d := range w.dims {
		if v := cost[d.of]; d.window() && v != 0 {
			if !taken {
				v = 0
			}
			ws = append(ws, windowAmount{i, v})
		}
	}
	return ws
}

// adjusted returns the windows an adjustment by delta takes from, in order
// (those an adjust script replies about), each with its amount, as
// scripted.prepare reads them: a window's dimension's, cut to a burst,
// unless whole, which names each window's own (a share's debt).
func (w *windowsSeen) adjusted(delta Cost, whole bool) []windowAmount {
	var ws []windowAmount
	for i, d := range w.dims {
		if !d.window() {
			continue
		}
		v, ok := delta[d.of]
		if whole {
			v, ok = delta[d.name]
		} else {
			v = max(min(v, d.limit.Burst), -d.limit.Burst)
		}
		if ok && v != 0 {
			ws = append(ws, windowAmount{i, v})
		}
	}
	return ws
}

// refilled is what saw holds at now: its tokens refilled at d's rate up to
// its burst since it was seen.
func (d dim) refilled(saw windowSaw, now time.Time) float64 {
	return min(d.limit.Burst, saw.tokens+max(now.Sub(saw.at).Seconds(), 0)*d.limit.Rate)
}

// keep records what the reply to an operation on key said of its windows,
// ws, each after the amount the operation took of it (in), as of now, and
// returns the windows to lower: those whose hash is not the one seen (a
// life of its own: Redis made it anew), to what was seen of them refilled
// since, less what the operation took.
func (w *windowsSeen) keep(key string, in []windowAmount, ws []windowReply, now time.Time) Cost {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen, ok := w.seen[key]
	if !ok {
		seen = make([]windowSaw, len(w.dims))
	}
	var lower Cost
	for j, a := range in {
		d, r, saw := w.dims[a.dim], ws[j], seen[a.dim]
		// As a window can hold: a reply that says more (a proxy's, a
		// server's bug) must not outlast Redis in this process.
		r.tokens = min(max(r.tokens, -d.limit.Burst), d.limit.Burst)
		if !saw.at.IsZero() && r.life != saw.life {
			// Any other life, not only a later one: a Redis that came
			// back with its clock behind makes its hashes with earlier
			// lives. A reply of the old hash that comes after one of the
			// new lowers at most what it took, once more.
			if to := d.refilled(saw, now) - a.amount; r.tokens > to {
				if lower == nil {
					lower = Cost{}
				}
				lower[d.name] = to
				// Seen of the old life still: the next reply, which finds
				// the window lowered, records the new one; or lowers it
				// again if this lowering failed.
				seen[a.dim].tokens, seen[a.dim].at = to, now
				continue
			}
		}
		seen[a.dim] = windowSaw{tokens: r.tokens, life: r.life, at: now}
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

// keepWindows is windowsSeen.keep for a reply about the windows in, ws,
// to an operation on key, lowering the windows Redis made anew. A lowering
// that failed is made again by the next reply, which finds the window new
// still.
func (s *scripted) keepWindows(ctx context.Context, key string, in []windowAmount, ws []windowReply) {
	w := s.fo.windows
	if lower := w.keep(key, in, ws, s.fo.clock.Now()); lower != nil {
		_ = w.lower(ctx, key, lower)
	}
}

// windowsCharged is the windows a reserve script's reply about a
// reservation of cost gives (see reserveScript), each with what it took
// if taken: none but the token bucket's.
func (s *scripted) windowsCharged(cost Cost, taken bool) []windowAmount {
	if s.fo.windows == nil {
		return nil
	}
	return s.fo.windows.charged(cost, taken)
}
