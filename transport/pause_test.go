package transport

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// pausedKeys is the count of paused keys at which a new pause cost 796 µs.
const pausedKeys = 80_000

// TestPauseCostBoundedAtManyKeys: once the pause map held 1,024 keys, every
// new pause rescanned it for pauses that were over: 796 µs per 429 at 80k
// paused keys. A pause costs amortised O(1): this asserts well under the
// old cost per pause at 80k live keys, and that pauses that are over are
// forgotten as the map grows.
func TestPauseCostBoundedAtManyKeys(t *testing.T) {
	var p pauses
	now := time.Unix(1_800_000_000, 0)
	const measured = 10_000
	keys := make([]string, pausedKeys+measured)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	for _, k := range keys[:pausedKeys] {
		p.pause(k, now.Add(time.Hour), now)
	}
	start := time.Now()
	for _, k := range keys[pausedKeys:] {
		p.pause(k, now.Add(time.Hour), now)
	}
	per := time.Since(start) / measured
	t.Logf("%v per pause at %d paused keys", per, pausedKeys)
	assert.Less(t, per, 50*time.Microsecond, "a pause does not rescan the map")
	assert.Len(t, p.m.m, len(keys), "every pause is live")

	later := now.Add(2 * time.Hour) // all over
	start = time.Now()
	for i := range len(keys) {
		p.pause("new"+strconv.Itoa(i), later.Add(time.Hour), later)
	}
	per = time.Since(start) / time.Duration(len(keys))
	t.Logf("%v per pause, sweeps included", per)
	assert.Less(t, per, 50*time.Microsecond, "sweeps are amortised")
	assert.LessOrEqual(t, len(p.m.m), len(keys)+minSweep, "pauses that are over are forgotten")
	assert.True(t, p.until(keys[0], later).IsZero())
}

// TestSamplerRemembersManyKeys: the sampler forgot every key once it held
// 1,024, so that with more keys than that nearly every accepted response
// was told to the bucket. It forgets only the observations no longer
// waited for.
func TestSamplerRemembersManyKeys(t *testing.T) {
	var s sampler
	now := time.Unix(1_800_000_000, 0)
	for i := range pausedKeys {
		assert.True(t, s.due("k"+strconv.Itoa(i), now))
	}
	due := 0
	for i := range pausedKeys {
		if s.due("k"+strconv.Itoa(i), now.Add(observeEvery/2)) {
			due++
		}
	}
	assert.Zero(t, due, "each key was observed less than observeEvery ago")
	assert.True(t, s.due("k0", now.Add(observeEvery)))
}

func BenchmarkPause(b *testing.B) {
	var p pauses
	now := time.Unix(1_800_000_000, 0)
	for i := range pausedKeys {
		p.pause("k"+strconv.Itoa(i), now.Add(time.Hour), now)
	}
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = "b" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		p.pause(keys[i], now.Add(time.Hour), now)
	}
}
