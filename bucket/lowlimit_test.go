package bucket_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
)

// TestLowLimitByRefusalsWarned: refusals that lower a key's rate below half
// its configured limit (a decrease to 0.4 of 60 a minute) are reported by
// one warn line, by "refusals", with both figures, on Local and on Redis;
// the refusals before the decrease, which lower nothing, by none. The
// headers' case is TestLowLimitWarned (transport).
func TestLowLimitByRefusalsWarned(t *testing.T) {
	p := adaptive.DefaultPolicy()
	p.Decrease = 0.4
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			var logs syncBuffer
			b := be.new(t, bucket.PerMinute(60), bucket.WithPolicy(p),
				bucket.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			refusal := adaptive.Feedback{Class: adaptive.RateLimited}
			for i := range p.Threshold {
				require.NoError(t, b.Observe(t.Context(), "k", refusal))
				if i < p.Threshold-1 {
					assert.Empty(t, logs.String(), "refusal %d: nothing lowered yet", i)
				}
			}
			out := logs.String()
			assert.Equal(t, 1, strings.Count(out, "level=WARN"), out)
			assert.Contains(t, out, "by=refusals")
			assert.Contains(t, out, `configured="60/min burst 60"`)
			assert.Contains(t, out, `effective="24/min burst 24"`)
		})
	}
}
