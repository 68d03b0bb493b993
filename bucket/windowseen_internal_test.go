package bucket

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWindowsSeenLowersANewHash: a reply from a window's hash of another
// life than the one seen (a later or an earlier one: a Redis back with its
// clock behind) is lowered to what was seen, refilled since, less what the
// operation took; one from the same hash is recorded as it is (refunds
// raise it); a reply out of a window's range is held to it.
func TestWindowsSeenLowersANewHash(t *testing.T) {
	dims := []dim{newDim("requests", "requests", PerSecond(50)), newDim("requests/24h0m0s", "requests", PerDay(86400))}
	w := newWindowsSeen(dims)
	t0 := time.Unix(1000, 0)
	one := w.charged(Cost{Requests: 1}, true)
	reply := func(tokens float64, life int64) []windowReply { return []windowReply{{tokens, life}} }
	require.Equal(t, []windowAmount{{1, 1}}, one)
	require.Equal(t, []windowAmount{{1, 0}}, w.charged(Cost{Requests: 1}, false), "refused: took nothing")
	require.Empty(t, w.charged(Cost{Tokens: 5}, true))
	require.Equal(t, []windowAmount{{1, -3}}, w.adjusted(Cost{Requests: -3}, false))
	require.Equal(t, []windowAmount{{1, 2}}, w.adjusted(Cost{"requests/24h0m0s": 2, Requests: 9}, true), "a debt names the window")

	assert.Nil(t, w.keep("k", one, reply(10, 7), t0), "nothing seen: nothing to lower")
	assert.Nil(t, w.keep("k", one, reply(40, 7), t0.Add(time.Second)), "the same hash: a refund raised it")
	got, _ := w.tokens("k", t0.Add(3*time.Second))
	assert.InDelta(t, 42, got["requests/24h0m0s"], 1e-9, "refilled at 1/s since")

	// Redis made the hash anew: 86,399 read, 42 + 1 refilled seen, 1 taken.
	lower := w.keep("k", one, reply(86399, 9), t0.Add(4*time.Second))
	assert.InDelta(t, 42, lower["requests/24h0m0s"], 1e-9)
	// The next reply finds it lowered, and records the new hash.
	assert.Nil(t, w.keep("k", one, reply(41, 9), t0.Add(4*time.Second)))
	// Had the lowering failed, the next reply lowers it again.
	w.keep("k", one, reply(86399, 11), t0.Add(4*time.Second))
	lower = w.keep("k", one, reply(86398, 11), t0.Add(4*time.Second))
	assert.InDelta(t, 39, lower["requests/24h0m0s"], 1e-9, "40 seen when it lowered, less this one")
	assert.Nil(t, w.keep("k", one, reply(38, 11), t0.Add(4*time.Second)))

	// A hash of an earlier life is new too.
	lower = w.keep("k", one, reply(86000, 3), t0.Add(5*time.Second))
	assert.InDelta(t, 38, lower["requests/24h0m0s"], 1e-9, "38 seen, 1 refilled, 1 taken")
	assert.Nil(t, w.keep("k", one, reply(37, 3), t0.Add(5*time.Second)))

	w.keep("k", one, reply(math.MaxInt64/1e6, 3), t0.Add(5*time.Second))
	got, _ = w.tokens("k", t0.Add(5*time.Second))
	assert.Equal(t, 86400.0, got["requests/24h0m0s"], "held to the burst")
	w.keep("k", one, reply(-1e15, 3), t0.Add(5*time.Second))
	got, _ = w.tokens("k", t0.Add(5*time.Second))
	assert.Equal(t, -86400.0, got["requests/24h0m0s"], "and to a burst's debt")
}

// TestWindowsSeenForgetsFullWindows: the record drops the keys whose
// windows have refilled to their bursts once it has doubled.
func TestWindowsSeenForgetsFullWindows(t *testing.T) {
	dims := []dim{newDim("requests", "requests", PerSecond(50)), newDim("requests/1m0s", "requests", PerMinute(60))}
	w := newWindowsSeen(dims)
	t0 := time.Unix(1000, 0)
	for i := range minWindowSweep - 1 {
		w.keep(string(rune('a'+i)), w.charged(N(1), true), []windowReply{{0, 1}}, t0)
	}
	require.EqualValues(t, minWindowSweep-1, w.n.Load())
	w.keep("last", w.charged(N(1), true), []windowReply{{0, 1}}, t0.Add(time.Minute))
	assert.EqualValues(t, 1, w.n.Load(), "the others refilled in the minute")
	_, ok := w.tokens("a", t0.Add(time.Minute))
	assert.False(t, ok)
}

// FuzzReservation: a reserve script's reply that the scripts never give is
// an error, never a panic; a valid one with windows gives each window's
// tokens and life.
func FuzzReservation(f *testing.F) {
	f.Add(int64(0), int64(0), int64(0), int64(5_000_000), int64(17), 1, 1)
	f.Add(int64(-300), int64(2), int64(1), int64(-1), int64(0), 0, 0)
	f.Add(int64(9), int64(-1), int64(4), int64(1), int64(-2), 2, 1)
	f.Fuzz(func(t *testing.T, w, epoch, pins, tokens, life int64, n, windows int) {
		n, windows = n%6, windows%3
		if n < 0 || windows < 0 {
			return
		}
		v := []any{w, epoch, pins}[:min(n, 3)]
		for range max(n-3, 0) {
			v = append(v, tokens, life)
		}
		rep, err := reservation(v, 1, windows)
		if err != nil {
			return
		}
		assert.Len(t, rep.windows, windows)
		for _, wr := range rep.windows {
			assert.GreaterOrEqual(t, wr.life, int64(0))
		}
		assert.True(t, pins >= 0 && pins <= pinHeld|pinIgnored || len(v) < 3, "pins %d read", pins)
	})
}
