package bucket_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// decreasedCapDebt decreases key (10 per 10 s, under a law that recovers
// in 1200 s, additively: a 429 cuts it to 0.7 and pauses it a second),
// caps it at 5 per 10 s (no remaining: 0.5/s, 10 s) and drains it 200 deep
// (20 calls of 10 taken at once), so that its refill over the next
// minutes, at a fraction that recovers meanwhile, never reaches its burst.
func decreasedCapDebt(t *testing.T, b bucket.Bucket, key string) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
		bucket.Requests: {Limit: 5, Remaining: -1, Window: 10 * time.Second}}}))
	require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.RateLimited, Epoch: 1 << 40}))
	for range 60 {
		r, err := b.Reserve(ctx, key, bucket.N(10), bucket.Unlimited)
		require.NoError(t, err)
		require.True(t, r.OK)
	}
}

var decreasedPolicy = adaptive.Policy{Threshold: 1, Recovery: adaptive.Additive}

// TestReadAfterCapAtRecoveringFraction: decreasedCapDebt's key is read
// 20 s in (its cap ended at 10 s) and again 300 s later, with nothing
// written between. Local's second read refills the cap's 10 s and the
// 310 s since at the fraction it is at then, as the scripts do with no
// read between (0.7 to 0.96 over 310 s). The scripts' first read wrote
// the cap's end into the hash with the fraction it was at then (the fold's
// t, less what 0.7 of our rate would add up to the cap's end, as of the
// old ts), and the second refilled the whole time from ts at the later
// fraction: the cap's 10 s came back at the difference, 0.5 more per
// second than the cap gave, 1.3 more tokens in all.
func TestReadAfterCapAtRecoveringFraction(t *testing.T) {
	got := map[string][2]float64{}
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			key := "cap-read-" + be.name
			b := be.new(t, bucket.Limit{Rate: 1, Burst: 10}, bucket.WithPolicy(decreasedPolicy))
			decreasedCapDebt(t, b, key)
			be.advance(20 * time.Second)
			first := be.tokens(t, key)[bucket.Requests]
			be.advance(300 * time.Second)
			got[be.name] = [2]float64{first, be.tokens(t, key)[bucket.Requests]}
		})
	}
	t.Logf("local %v, redis %v", got["local"], got["redis"])
	assert.InDelta(t, got["local"][0], got["redis"][0], 1e-3, "the first read")
	assert.InDelta(t, got["local"][1], got["redis"][1], 1e-3, "the second read")
}

// TestRefusalAfterCapAtRecoveringFraction: as
// TestReadAfterCapAtRecoveringFraction, with a refused call (max wait
// 0) in place of the first read: a refusal takes nothing, and Local and
// the scripts must then hold the same.
func TestRefusalAfterCapAtRecoveringFraction(t *testing.T) {
	got := map[string]float64{}
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			key := "cap-refused-" + be.name
			b := be.new(t, bucket.Limit{Rate: 1, Burst: 10}, bucket.WithPolicy(decreasedPolicy))
			decreasedCapDebt(t, b, key)
			be.advance(20 * time.Second)
			r, err := b.Reserve(t.Context(), key, bucket.N(1), 0)
			require.NoError(t, err)
			require.False(t, r.OK)
			be.advance(300 * time.Second)
			got[be.name] = be.tokens(t, key)[bucket.Requests]
		})
	}
	t.Logf("local %v, redis %v", got["local"], got["redis"])
	assert.InDelta(t, got["local"], got["redis"], 1e-3)
}

// TestRefusalAtRecoveringFraction: no cap. A decreased key drained 200
// deep is refused a call 20 s in and read 300 s later. Local's refusal
// wrote the key refilled to then at the fraction then; the scripts' wrote
// nothing, and refill the whole 320 s at the later fraction.
func TestRefusalAtRecoveringFraction(t *testing.T) {
	got := map[string]float64{}
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			key := "refused-" + be.name
			b := be.new(t, bucket.Limit{Rate: 1, Burst: 10}, bucket.WithPolicy(decreasedPolicy))
			require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.RateLimited, Epoch: 1 << 40}))
			for range 60 {
				r, err := b.Reserve(ctx, key, bucket.N(10), bucket.Unlimited)
				require.NoError(t, err)
				require.True(t, r.OK)
			}
			be.advance(20 * time.Second)
			r, err := b.Reserve(ctx, key, bucket.N(1), 0)
			require.NoError(t, err)
			require.False(t, r.OK)
			be.advance(300 * time.Second)
			got[be.name] = be.tokens(t, key)[bucket.Requests]
		})
	}
	t.Logf("local %v, redis %v", got["local"], got["redis"])
	assert.InDelta(t, got["local"], got["redis"], 1e-3)
}

// TestLeaseOfCappedKey: a lease (WithLeasing) of a key a report
// caps: the lease script's store is called without the rate and burst
// after the report's end (arate, aburst), and its expiry's arithmetic on
// nil fails the script. The first call falls back to a plain reservation
// and so does every call for the ttl: ten calls, ten script calls, not
// one.
func TestLeaseOfCappedKey(t *testing.T) {
	rdb := leaseRedis(t)
	ctx := t.Context()
	b := bucket.NewRedis(rdb, bucket.Limit{Rate: 100, Burst: 1000}, bucket.WithLeasing(10, time.Second))
	t.Cleanup(func() { b.Close() })
	warm(t, b)
	require.NoError(t, b.Observe(ctx, "k", adaptive.Feedback{Quotas: map[string]adaptive.Quota{
		bucket.Requests: {Limit: 3000, Remaining: -1, Window: time.Minute}}}))
	calls0 := redistest.ScriptCalls(t, rdb)
	for range 10 {
		r, err := b.Reserve(ctx, "k", bucket.N(1), 0)
		require.NoError(t, err)
		require.True(t, r.OK)
	}
	assert.Equal(t, calls0+1, redistest.ScriptCalls(t, rdb), "one lease serves the ten calls")
	assert.InDelta(t, 990, leaseTokens(t, b, "k")[bucket.Requests], 0.5)
}

// TestCapEndBoundsTheFleet: under 10/s (burst 10) a cap of 5/s (50 per
// 10 s, no remaining) for 10 s; 200 calls reserved at once are paced at
// the cap, the last at 38 s. The key refills at the cap to its end and at
// 10/s after, so it has repaid the queue's debt by 24 s, and the calls
// reserved from then go at 10/s; but the slots handed out at the cap
// still come at 5/s until 38 s: 15/s between, 210 calls in the 14 s from
// 24 s where Burst + Rate·T is 150. Every interval between two slots must
// hold at most Burst + Rate·T of them.
func TestCapEndBoundsTheFleet(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			key := "cap-bound-" + be.name
			lim := bucket.PerSecond(10)
			b := be.new(t, lim)
			require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
				bucket.Requests: {Limit: 50, Remaining: -1, Window: 10 * time.Second}}}))
			var slots []time.Duration // after the first call
			var at time.Duration
			reserve := func() {
				r, err := b.Reserve(ctx, key, bucket.N(1), bucket.Unlimited)
				require.NoError(t, err)
				require.True(t, r.OK)
				slots = append(slots, at+r.Delay)
			}
			for range 200 {
				reserve()
			}
			// Then one call every 0.1 s, from 24 s to 40 s.
			be.advance(24 * time.Second)
			at = 24 * time.Second
			for range 160 {
				reserve()
				be.advance(100 * time.Millisecond)
				at += 100 * time.Millisecond
			}
			slices.Sort(slots)
			worst, from, to := 0.0, time.Duration(0), time.Duration(0)
			for i := range slots {
				for j := i; j < len(slots); j++ {
					over := float64(j-i+1) - (lim.Burst + lim.Rate*(slots[j]-slots[i]).Seconds())
					if over > worst {
						worst, from, to = over, slots[i], slots[j]
					}
				}
			}
			assert.LessOrEqual(t, worst, 1.0, "%.0f calls over Burst + Rate·T between %v and %v", worst, from, to)
		})
	}
}
