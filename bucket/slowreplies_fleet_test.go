package bucket_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// slowReplies is the fault matrix's row of a Redis whose replies come
// 300 ms late for 3 s, from 2 s into the run: longer than the call timeout
// (250 ms), so the processes go to their shares, and come back one at a
// time as their probes find Redis answering again.
var slowReplies = matrixRow{name: "replies 300 ms late for 3 s", at: matrixMid, act: func(e *matrixRun) {
	e.proxy.SetLatency(150 * time.Millisecond) // each way: a round trip 300 ms longer
	time.Sleep(3 * time.Second)
	e.proxy.SetLatency(0)
}}

// TestFleetSlowRepliesWithinBound: four processes of eight goroutines
// (coalescing on, failing open) saturate one key at 50/s while Redis's
// replies come 300 ms late for 3 s. The first process back from its share
// took Redis's refilled tokens at once while the others still admitted on
// theirs: 364-372 admitted in 5.4-5.6 s where Burst + Rate·T + Burst/n
// allows 331-340. Admitted must stay within Burst + Rate·T + Burst/n (+1).
func TestFleetSlowRepliesWithinBound(t *testing.T) {
	if testing.Short() {
		t.Skip("a fleet of processes for about 10 s")
	}
	l := runMatrixRow(t, matrixLine{row: slowReplies})
	t.Log(matrixTableLine(l))
	assert.Zero(t, l.res.Lost, "no call lost while failing open")
	assert.Positive(t, l.res.OnShare, "the processes went to their shares")
	assert.LessOrEqual(t, float64(l.res.Admitted), l.shareBound()+1,
		"admitted within Burst + Rate·T + Burst/n over T = %v", l.span)
}
