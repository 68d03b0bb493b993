package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestSummaryExplainsAboveTheLimit: a run faster than the limit's rate (its
// burst spent at the start) says why, under the figure; one within it says
// nothing. The summary printed "102.8% of the limit" right after the README
// said "no faster", and explained nothing.
func TestSummaryExplainsAboveTheLimit(t *testing.T) {
	for _, tc := range []struct {
		tokens int64
		want   bool
	}{{10_280, true}, {9_900, false}} {
		s := summary{jobs: 10, ok: 10, rpm: 600, tpm: 6_000, reqBurst: 10, tokBurst: 2_000,
			makespan: 100 * time.Second, tokens: tc.tokens, fake: true, redis: "an embedded Redis"}
		var out strings.Builder
		s.print(&out, "")
		assert.Equal(t, tc.want, strings.Contains(out.String(), "above 100%: the bucket admits its burst (10 requests, 2,000 tokens: -burst) at once"),
			"%d tokens in 100 s against 100/s: %s", tc.tokens, out.String())
	}
}
