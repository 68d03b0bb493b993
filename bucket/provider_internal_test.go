package bucket

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
)

// TestQueueEndCountsProviderBucket: queueEnd says when the last
// slot reserved on a key comes due (a fail-open share after another starts
// each key there, share.go). With the provider's bucket no longer capping
// the key's own rate, the own bucket's debt is repaid at the configured
// rate and queueEnd ends 81 s before the last slot.
func TestQueueEndCountsProviderBucket(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clk := frozenClock(now)
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

// TestReseededBucketHoldsSlot: a waiter's slot (5 s) rests on the
// provider's bucket (60 a minute, none left). A report that drops that
// bucket keeps the slot (8e85a10: its debt is in ours). A report that
// then seeds a new provider's bucket (5 left) makes a bucket the waiter
// was never charged in, and its queue's end is now: the waiter moves up
// to now, where a new call finds the same 5 tokens. The waiter's debt,
// folded into ours, is owed once in ours and spent at once.
func TestReseededBucketHoldsSlot(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clk := frozenClock(now)
	l := NewLocal(PerSecond(10), WithClock(clk))
	ctx := t.Context()
	obs := func(q adaptive.Quota) {
		require.NoError(t, l.Observe(ctx, "k", adaptive.Feedback{Quotas: map[string]adaptive.Quota{Requests: q}}))
	}
	obs(adaptive.Quota{Limit: 60, Remaining: 0, Window: time.Minute})
	r, mv, err := l.reserveAt(ctx, "k", N(5), Unlimited)
	require.NoError(t, err)
	require.InDelta(t, 5*time.Second, r.Delay, float64(time.Millisecond))
	slot := time.Now().Add(r.Delay)

	obs(adaptive.Quota{Limit: 60, Remaining: -1, Window: time.Minute}) // drops the provider's bucket
	q, err := l.earliest(ctx, "k", N(5))
	require.NoError(t, err)
	assert.Equal(t, slot, movedTo(slot, mv.place, q), "dropped: the slot holds")

	obs(adaptive.Quota{Limit: 60, Remaining: 5, Window: time.Minute}) // a new provider's bucket
	q, err = l.earliest(ctx, "k", N(5))
	require.NoError(t, err)
	at := movedTo(slot, mv.place, q)
	assert.Equal(t, slot, at, "re-seeded: the waiter moved up by %v", slot.Sub(at))
}
