package bucket_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// A report that caps a key's own rate (a limit with no remaining), the
// reads of a key, and a zero Adjust, each under Local and the scripts
// alike: the faults left open in December 2026 (docs/reference.md).

// capQueue observes a cap of 5/s (50 per 10 s, no remaining: burst 10,
// the configured one) for 10 s on key, under 10/s, and reserves 100 calls
// at once: 10 go at once and 90 are paced at 5/s, the last at 18 s.
func capQueue(t *testing.T, b bucket.Bucket, key string) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
		bucket.Requests: {Limit: 50, Remaining: -1, Window: 10 * time.Second}}}))
	var last time.Duration
	for range 100 {
		r, err := b.Reserve(ctx, key, bucket.N(1), bucket.Unlimited)
		require.NoError(t, err)
		require.True(t, r.OK)
		last = r.Delay
	}
	require.InDelta(t, 18*time.Second, last, float64(time.Millisecond), "the cap paces the queue")
}

// TestExpiredCapRefillsAtCapUntilItsEnd: capQueue's key, 12 s in. Until
// the cap's end (10 s) the key refilled at 5/s, 50 of its debt of 90; the
// 40 still owed were paced at the cap, their last slot at 18 s, so they
// are carried into ours at what they are worth at 10/s, 80, repaid at 18
// s too: 60 owed at 12 s, and a call waits 6.1 s, after the last paced
// slot. The key refilled the whole 12 s at 10/s and read full, with 30
// paced slots still to come; with the 40 carried as 40, it owed 20 and a
// call went at 14.1 s, before the last 20 of them
// (TestCapEndBoundsTheFleet).
func TestExpiredCapRefillsAtCapUntilItsEnd(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			key := "cap-end-" + be.name
			b := be.new(t, bucket.PerSecond(10))
			capQueue(t, b, key)
			be.advance(12 * time.Second)
			assert.InDelta(t, -60, be.tokens(t, key)[bucket.Requests], 1e-3)
			r, err := b.Reserve(t.Context(), key, bucket.N(1), bucket.Unlimited)
			require.NoError(t, err)
			assert.InDelta(t, 6100*time.Millisecond, r.Delay, float64(time.Millisecond))
		})
	}
}

// TestExpiredCapOutlivesItsRefill: a cap of 0.5/s and 5 (5 per 10 s)
// under 1/s and 100 counts 100 s (one refill of the configured limit);
// 5 calls empty the key at once. At the cap's end it holds 5 again, and
// it refills to 100 at 1/s from then: 55 at 150 s, full at 195 s. The
// hash was set to expire at 110 s (from the capped limit, full at 10 s,
// after the cap's end plus the capped refill time), and read full
// after it.
func TestExpiredCapOutlivesItsRefill(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			key := "cap-expiry-" + be.name
			b := be.new(t, bucket.Limit{Rate: 1, Burst: 100})
			require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
				bucket.Requests: {Limit: 5, Remaining: -1, Window: 10 * time.Second}}}))
			r, err := b.Reserve(ctx, key, bucket.N(5), 0)
			require.NoError(t, err)
			require.True(t, r.OK)
			for _, at := range []struct {
				after time.Duration
				want  float64
			}{{90 * time.Second, 5}, {60 * time.Second, 55}, {40 * time.Second, 95}, {10 * time.Second, 100}} {
				be.advance(at.after)
				assert.InDelta(t, at.want, be.tokens(t, key)[bucket.Requests], 1e-3)
			}
		})
	}
}

// TestReadsDuringCapChangeNothing: capQueue's key, read at 1 s, 5 s and
// 9.5 s, still under the cap; at 12 s a call waits 6.1 s as it does with
// no read (TestExpiredCapRefillsAtCapUntilItsEnd). A Local read wrote
// the key refilled to then, at the cap, and the end of the cap found
// Local and the scripts apart: Local's key refilled from the read at 10/s
// (a call at 12 s went at once), the scripts' key from its last write.
func TestReadsDuringCapChangeNothing(t *testing.T) {
	got := map[string]time.Duration{}
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			key := "cap-reads-" + be.name
			b := be.new(t, bucket.PerSecond(10))
			capQueue(t, b, key)
			var moved time.Duration
			for _, at := range []time.Duration{time.Second, 5 * time.Second, 9500 * time.Millisecond} {
				be.advance(at - moved)
				moved = at
				assert.InDelta(t, -90+5*at.Seconds(), be.tokens(t, key)[bucket.Requests], 1e-3)
				if l, ok := b.(*bucket.Local); ok {
					assert.Equal(t, 5.0, l.Rate(key)[bucket.Requests])
				}
			}
			be.advance(12*time.Second - moved)
			r, err := b.Reserve(t.Context(), key, bucket.N(1), bucket.Unlimited)
			require.NoError(t, err)
			got[be.name] = r.Delay
			assert.InDelta(t, 6100*time.Millisecond, r.Delay, float64(time.Millisecond))
		})
	}
	assert.InDelta(t, got["local"], got["redis"], float64(time.Millisecond))
}

// TestColdReadMakesNoKey: on a cold start a key that no call has charged
// is empty; a read of it (Tokens) makes none on Redis, and a call of 10
// half a second later makes it with the 10 it takes (adaptive.Policy's
// ColdStart) and goes at once. A Local read made the key, empty from
// then: the call found 5 and was refused.
func TestColdReadMakesNoKey(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			key := "cold-read-" + be.name
			b := be.new(t, bucket.PerSecond(10), bucket.WithPolicy(adaptive.Policy{ColdStart: true}))
			assert.Equal(t, 0.0, be.tokens(t, key)[bucket.Requests])
			if l, ok := b.(*bucket.Local); ok {
				assert.Equal(t, 10.0, l.Rate(key)[bucket.Requests])
				assert.Zero(t, l.Len(), "a read makes no key")
			}
			be.advance(500 * time.Millisecond)
			r, err := b.Reserve(t.Context(), key, bucket.N(10), 0)
			require.NoError(t, err)
			assert.True(t, r.OK, "refused: retry after %v", r.RetryAfter)
		})
	}
}

// TestColdZeroAdjustMakesNoKey: on a cold start a zero Adjust (or
// Settle) of a key no call has charged makes none (the scripts run
// nothing for it), and a call of 10 half a second later goes at once.
// Local made the key, empty from then: the call found 5 and was refused.
func TestColdZeroAdjustMakesNoKey(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			b := be.new(t, bucket.PerSecond(10), bucket.WithPolicy(adaptive.Policy{ColdStart: true}),
				bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 100, Burst: 1000}))
			for i, adjust := range []func(key string, c bucket.Cost) error{
				func(key string, c bucket.Cost) error { return b.Adjust(ctx, key, c) },
				func(key string, c bucket.Cost) error { return b.(bucket.Settler).Settle(ctx, key, c) },
			} {
				key := []string{"cold-adjust-", "cold-settle-"}[i] + be.name
				l, local := b.(*bucket.Local)
				var n int
				if local {
					n = l.Len()
				}
				require.NoError(t, adjust(key, bucket.Cost{bucket.Requests: 0, bucket.Tokens: 0}))
				if local {
					assert.Equal(t, n, l.Len(), "a zero delta makes no key")
				}
				be.advance(500 * time.Millisecond)
				r, err := b.Reserve(ctx, key, bucket.Cost{bucket.Requests: 10, bucket.Tokens: 1000}, 0)
				require.NoError(t, err)
				assert.True(t, r.OK, "refused: retry after %v", r.RetryAfter)
			}
		})
	}
}

// TestExpiredProviderBucketCapsUntilItsEnd: a provider's bucket no larger
// than ours (60 a minute, all left, under 10/s and 100) caps our rate at
// its 1/s too. 60 calls empty both at once; a 429 pauses the key 10 s,
// which leaves ours empty at its end while the provider's refills to 10.
// At the report's end (60 s) ours has refilled at 1/s to 50, and from
// then at 10/s: 60 at 61 s. Ours refilled at 10/s from the pause's end
// (to the provider's 60 at 60 s) and held 70.
func TestExpiredProviderBucketCapsUntilItsEnd(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			key := "provider-cap-" + be.name
			b := be.new(t, bucket.Limit{Rate: 10, Burst: 100})
			require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
				bucket.Requests: {Limit: 60, Remaining: 60, Window: time.Minute}}}))
			r, err := b.Reserve(ctx, key, bucket.N(60), 0)
			require.NoError(t, err)
			require.True(t, r.OK)
			require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.RateLimited,
				HasRetryAfter: true, RetryAfter: 10 * time.Second}))
			be.advance(61 * time.Second)
			assert.InDelta(t, 60, be.tokens(t, key)[bucket.Requests], 1e-3)
		})
	}
}

// decreasedCapDebt decreases key (10 per 10 s, under a law that recovers
// in 1200 s, additively: a 429 cuts it to 0.7 and pauses it a second),
// caps it at 5 per 10 s (no remaining: 0.5/s, 10 s) if capped, and drains
// it 590 deep (60 calls of 10 taken at once), so that its refill over the
// next minutes, at a fraction that recovers meanwhile, never reaches its
// burst.
func decreasedCapDebt(t *testing.T, b bucket.Bucket, key string, capped bool) {
	t.Helper()
	ctx := t.Context()
	if capped {
		require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
			bucket.Requests: {Limit: 5, Remaining: -1, Window: 10 * time.Second}}}))
	}
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
			decreasedCapDebt(t, b, key, true)
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

// TestRefusalAtRecoveringFraction: decreasedCapDebt's key, capped or
// not, is refused a call (max wait 0) 20 s in and read 300 s later. A
// refusal takes nothing, and Local and the scripts must then hold the
// same: Local's refusal wrote the key refilled to then at the fraction
// then, the scripts' wrote nothing, and refilled the whole 320 s at the
// later fraction (as TestReadAfterCapAtRecoveringFraction's first read).
func TestRefusalAtRecoveringFraction(t *testing.T) {
	for _, capped := range []bool{false, true} {
		got := map[string]float64{}
		for _, be := range backends(t) {
			t.Run(fmt.Sprintf("capped=%v/%s", capped, be.name), func(t *testing.T) {
				key := fmt.Sprintf("refused-%v-%s", capped, be.name)
				b := be.new(t, bucket.Limit{Rate: 1, Burst: 10}, bucket.WithPolicy(decreasedPolicy))
				decreasedCapDebt(t, b, key, capped)
				be.advance(20 * time.Second)
				r, err := b.Reserve(t.Context(), key, bucket.N(1), 0)
				require.NoError(t, err)
				require.False(t, r.OK)
				be.advance(300 * time.Second)
				got[be.name] = be.tokens(t, key)[bucket.Requests]
			})
		}
		t.Logf("capped %v: local %v, redis %v", capped, got["local"], got["redis"])
		assert.InDelta(t, got["local"], got["redis"], 1e-3, "capped %v", capped)
	}
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

// TestCapEndsUnderSteadyLoad: under 10/s (burst 10) a cap of 5/s (50 per
// 10 s, no remaining) for 10 s, or a provider's bucket of 50 at 5/s (none
// remaining), and callers at 8/s that wait at most 5 s.
// The cap's time ends at 10 s; from then the key is at 10/s, more than
// the callers ask, so once the slots reserved under the cap (at most 5 s
// of them) have gone, from 15 s at the latest, every call is served. A
// report that counts on while a debt taken under it is unpaid never ends
// here: each call served adds to that debt at the cap's pace, faster than
// it is repaid, and the key stays at 5/s for good (an end worked out anew
// at each read from the debt, tried and taken back).
func TestCapEndsUnderSteadyLoad(t *testing.T) {
	for _, c := range []struct {
		name      string
		remaining float64
	}{{"cap", -1}, {"provider", 0}} {
		for _, be := range backends(t) {
			t.Run(c.name+"/"+be.name, func(t *testing.T) {
				steadyAfterCap(t, be, c.remaining)
			})
		}
	}
}

// steadyAfterCap is TestCapEndsUnderSteadyLoad on be, with a report's
// remaining (-1: none, a cap; else the provider's bucket).
func steadyAfterCap(t *testing.T, be *controlled, remaining float64) {
	ctx := t.Context()
	key := "cap-steady-" + be.name
	b := be.new(t, bucket.PerSecond(10))
	require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Quotas: map[string]adaptive.Quota{
		bucket.Requests: {Limit: 50, Remaining: remaining, Window: 10 * time.Second}}}))
	served, asked := 0, 0
	for at := time.Duration(0); at < 60*time.Second; at += 125 * time.Millisecond {
		r, err := b.Reserve(ctx, key, bucket.N(1), 5*time.Second)
		require.NoError(t, err)
		if at >= 30*time.Second {
			asked++
			if r.OK {
				served++
			}
		}
		be.advance(125 * time.Millisecond)
	}
	assert.Equal(t, asked, served, "calls served from 30 s to 60 s, at 8/s under 10/s, 50 s after the report's end")
}
