package tiktoken

import (
	"bytes"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
)

// cost is what a call used: the bytes it allocated, the CPU time the
// process spent meanwhile (its wall time where that cannot be read), and
// its wall time.
type cost struct {
	allocated uint64
	cpu, wall time.Duration
}

// measure returns what f cost.
func measure(f func()) cost {
	var before, after runtime.MemStats
	runtime.GC() // the garbage of what came before, not collected on f's time
	runtime.ReadMemStats(&before)
	cpu0, _ := processCPU()
	start := time.Now()
	f()
	c := cost{wall: time.Since(start)}
	cpu1, ok := processCPU()
	runtime.ReadMemStats(&after)
	c.allocated, c.cpu = after.TotalAlloc-before.TotalAlloc, cpu1-cpu0
	if !ok {
		c.cpu = c.wall
	}
	return c
}

// assertTime checks that c took at most 100 ms of CPU per MB of input,
// and at most 1 s of wall time per MB (each slowdown times more under the
// race detector): the promise, in CPU time so that it holds however loaded
// the machine, and a bound on the wall time that catches a call that
// hangs, in between.
func assertTime(t *testing.T, c cost, mb int) {
	t.Helper()
	assert.LessOrEqual(t, c.cpu, slowdown*time.Duration(mb)*100*time.Millisecond, "CPU time for %d MB", mb)
	assert.LessOrEqual(t, c.wall, slowdown*time.Duration(mb)*time.Second, "wall time for %d MB", mb)
}

// TestCounterCutsBeforeItCleans: 100 MB of invalid UTF-8 ("a\xff" over and
// over) was made valid whole before it was cut to maxText, allocating
// 839 MiB (and taking 10 s); valid text of the same size, 10.7 MiB. It is
// cut first and cleaned a chunk at a time: what any text of 100 MB
// allocates beyond what its first maxText bytes do, alone, is at most
// 16 times maxText, and it takes at most 100 ms of CPU per MB.
func TestCounterCutsBeforeItCleans(t *testing.T) {
	o200k.get() // the vocabulary, loaded once
	const size = 100 << 20
	for name, unit := range map[string]string{
		"invalid UTF-8":      "a\xff",
		"invalid runs":       "\xff",
		"continuation bytes": "\x80",
		"valid text":         "a",
		"whitespace":         " \n",
	} {
		t.Run(name, func(t *testing.T) {
			s := strings.Repeat(unit, size/len(unit))
			cut := measure(func() { newCounter(o200k).add(s[:maxText]) })
			whole := measure(func() { newCounter(o200k).add(s) })
			assert.LessOrEqual(t, whole.allocated, cut.allocated+16*uint64(maxText),
				"bytes allocated for 100 MB, beyond the %d its cut allocates", cut.allocated)
			assertTime(t, whole, size>>20)
			t.Logf("100 MB: %.1f MiB allocated (its cut alone: %.1f), %v CPU, %v wall",
				float64(whole.allocated)/(1<<20), float64(cut.allocated)/(1<<20), whole.cpu, whole.wall)
		})
	}
}

// nestedTool returns a chat completion request whose one tool's parameters
// nest an object depth levels deep, in whose last level n properties of
// about 100 bytes each hold nearly all of the body.
func nestedTool(depth, n int) []byte {
	var leaf strings.Builder
	leaf.WriteString(`{"type":"object","properties":{`)
	for i := range n {
		if i > 0 {
			leaf.WriteByte(',')
		}
		fmt.Fprintf(&leaf, `"p%d":{"type":"string","description":"The name of the city the forecast is for, in English, as it is spelt on a map."}`, i)
	}
	leaf.WriteString(`}}`)
	level := `{"type":"object","description":"A level.","properties":{"next":`
	return []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"What is the weather?"}],"max_tokens":10,` +
		`"tools":[{"type":"function","function":{"name":"get_forecast","description":"Get the forecast.","parameters":` +
		strings.Repeat(level, depth) + leaf.String() + strings.Repeat(`}}`, depth) + `}}]}`)
}

// TestNestedSchemaDecodedOnce: a 17 MB tool schema nested 16 levels deep
// was decoded again at each level, taking 2.8 to 4 s and 834 MiB. It is
// decoded once: at most 100 ms of CPU per MB, and at most 12 bytes
// allocated per byte of body (the decoder's buffer, growing, the tools'
// copy, the schema's tree, and the tokenizer's 256 KiB).
func TestNestedSchemaDecodedOnce(t *testing.T) {
	body := nestedTool(maxSchemaDepth, 17<<20/118)
	require.InDelta(t, 17<<20, len(body), 1<<20)
	var c bucket.Cost
	used := measure(func() {
		r, err := http.NewRequest("POST", "https://api.example.com/v1/chat/completions", bytes.NewReader(body))
		require.NoError(t, err)
		c = RequestCost("")(r)
	})
	assert.Greater(t, c[bucket.Tokens], float64(17<<20/118), "each property of the last level counts")
	assertTime(t, used, len(body)>>20)
	assert.LessOrEqual(t, used.allocated, 12*uint64(len(body)), "bytes allocated")
	t.Logf("17 MB: %.0f MiB allocated, %v CPU, %v wall, %.0f tokens", float64(used.allocated)/(1<<20), used.cpu, used.wall, c[bucket.Tokens])
}

// TestNestedSchemaCountsAsBefore: decoded once, a nested schema counts
// what it counted decoded level by level.
func TestNestedSchemaCountsAsBefore(t *testing.T) {
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":""}],"max_tokens":1,"tools":[{"type":"function","function":` +
		`{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"string","enum":["x","y"]}}},` +
		`"c":{"type":"array","items":{"type":"object","properties":{"d":{"type":["string","null"],"description":"A d."}}}},"e":null}}}}]}`
	r, err := http.NewRequest("POST", "https://api.example.com/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	want := newCounter(o200k)
	for _, s := range []string{"user", "f:", "x", "y", "a:object:", "b:string:", "c:array:", "d:string|null:A d", "e::"} {
		want.add(s)
	}
	// 3 for the reply, 3 for the message; funcInit 7, propInit 3 at each of the
	// 3 objects with properties, propKey 3 for each of a to e, the enum -3 and
	// 3 a value, funcEnd 12; max_tokens 1.
	fixed := 3 + 3 + 7 + 3*3 + 3*5 - 3 + 3*2 + 12 + 1
	assert.Equal(t, float64(want.total()+fixed), RequestCost("")(r)[bucket.Tokens])
}
