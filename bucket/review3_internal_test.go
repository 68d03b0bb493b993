package bucket

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
)

type review3Clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *review3Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

// TestQueueEndCountsProviderBucket: queueEnd says when the last
// slot reserved on a key comes due (a fail-open share after another starts
// each key there, share.go). With the provider's bucket no longer capping
// the key's own rate, the own bucket's debt is repaid at the configured
// rate and queueEnd ends 81 s before the last slot.
func TestQueueEndCountsProviderBucket(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clk := &review3Clock{t: now}
	l := NewLocal(PerSecond(10), WithClock(clk))
	require.NoError(t, l.Observe(t.Context(), "k", adaptive.Feedback{Quotas: map[string]adaptive.Quota{
		Requests: {Limit: 60, Remaining: 10, Window: time.Minute}}}))
	var last time.Duration
	for range 100 {
		r, err := l.Reserve(t.Context(), "k", N(1), Unlimited)
		require.NoError(t, err)
		last = r.Delay
	}
	require.InDelta(t, 90*time.Second, last, float64(time.Millisecond))
	assert.False(t, l.queueEnd("k").Before(now.Add(last)), "queueEnd %v, last slot %v",
		l.queueEnd("k").Sub(now), last)
}
