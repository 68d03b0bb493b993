package bucket_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
)

// TestLocalAgreesWithScripts drives Local and the Lua scripts (under the
// same controlled clock) through the same random sequences of reports of
// every kind, 429s that ask for no wait, reservations, settlements and
// steps of time, over requests, tokens and a window of requests, and
// requires that they hand out the same slots and hold the same tokens:
// with the law's decreases off (reports with rates and resets), and on
// (reports without, which would forget the refusals).
func TestLocalAgreesWithScripts(t *testing.T) {
	for _, decreases := range []bool{false, true} {
		t.Run(fmt.Sprintf("decreases=%v", decreases), func(t *testing.T) {
			agree(t, decreases, 400)
		})
	}
}

func agree(t *testing.T, decreases bool, sequences int) {
	bes := backends(t)
	require.Len(t, bes, 2)
	pol := bucket.WithPolicy(adaptive.Policy{Threshold: 1_000_000})
	if decreases {
		pol = bucket.WithPolicy(adaptive.Policy{})
	}
	bs := make([]bucket.Bucket, len(bes))
	for i, be := range bes {
		bs[i] = be.new(t, bucket.PerSecond(10), pol,
			bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 100, Burst: 1000}),
			bucket.WithWindow(bucket.Requests, bucket.PerMinute(300)))
	}
	ctx := t.Context()
	quota := func(r *rand.Rand) adaptive.Quota {
		q := adaptive.Quota{Remaining: -1}
		if r.IntN(4) > 0 {
			q.Limit = float64([]int{5, 10, 30, 60, 600}[r.IntN(5)])
		}
		if r.IntN(3) > 0 {
			q.Remaining = float64(r.IntN(int(max(q.Limit, 5)) + 1))
		}
		if !decreases {
			switch r.IntN(3) {
			case 0:
				q.Window = []time.Duration{time.Second, 10 * time.Second, time.Minute}[r.IntN(3)]
			case 1:
				q.Reset = time.Duration(r.IntN(5000)+1) * time.Millisecond
			}
		}
		return q
	}
	for seq := range sequences {
		r := rand.New(rand.NewPCG(uint64(seq), 7))
		key := fmt.Sprintf("agree-%d", seq)
		var log []string
		for step := range 40 {
			var op string
			var got [2]string
			switch r.IntN(7) {
			case 0, 1:
				fb := adaptive.Feedback{Quotas: map[string]adaptive.Quota{bucket.Requests: quota(r)}}
				if r.IntN(2) == 0 {
					q := quota(r)
					q.Limit *= 100
					if q.Remaining > 0 {
						q.Remaining *= 100
					}
					fb.Quotas[bucket.Tokens] = q
				}
				if r.IntN(4) == 0 {
					fb.Class = adaptive.RateLimited
				}
				op = fmt.Sprintf("observe %+v", fb)
				for _, b := range bs {
					require.NoError(t, b.Observe(ctx, key, fb))
				}
			case 2:
				op = "a 429 that asks no wait"
				for _, b := range bs {
					require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.RateLimited, Epoch: 1 << 40}))
				}
			case 3, 4:
				n := float64(r.IntN(3) + 1)
				w := []time.Duration{0, time.Second, bucket.Unlimited}[r.IntN(3)]
				op = fmt.Sprintf("reserve %v, max wait %v", n, w)
				for i, b := range bs {
					res, err := b.Reserve(ctx, key, bucket.Cost{bucket.Requests: n, bucket.Tokens: n * 37}, w)
					require.NoError(t, err)
					got[i] = fmt.Sprintf("%v %.3f %.3f", res.OK, res.Delay.Seconds(), res.RetryAfter.Seconds())
				}
			case 5:
				n := float64(r.IntN(5) - 2)
				op = fmt.Sprintf("settle %v", n)
				for _, b := range bs {
					require.NoError(t, b.(bucket.Settler).Settle(ctx, key, bucket.Cost{bucket.Requests: n, bucket.Tokens: n * 53}))
				}
			case 6:
				d := time.Duration(r.IntN(3000)) * time.Millisecond
				if r.IntN(6) == 0 {
					d = time.Duration(r.IntN(70)) * time.Second
				}
				op = fmt.Sprintf("advance %v", d)
				for _, be := range bes {
					be.advance(d)
				}
			}
			log = append(log, fmt.Sprintf("%s: %s | %s", op, got[0], got[1]))
			if !sameReservation(got[0], got[1]) {
				t.Fatalf("sequence %d, step %d: Local and the scripts disagree:\n  %s", seq, step, strings.Join(log, "\n  "))
			}
		}
		// The window's reading (not its reservations) differs during a
		// pause: Local reads it refilled to the pause's end, the scripts
		// to now; it is left out.
		local, lua := bes[0].tokens(t, key), bes[1].tokens(t, key)
		for name, v := range local {
			if name != "requests/1m0s" && math.Abs(v-lua[name]) > 0.5 {
				t.Fatalf("sequence %d: tokens %v (Local) against %v (scripts):\n  %s", seq, local, lua, strings.Join(log, "\n  "))
			}
		}
	}
}

// sameReservation reports whether two reservations, as "OK delay
// retry-after" in seconds, agree within the scripts' rounding.
func sameReservation(a, b string) bool {
	if a == b {
		return true
	}
	var oa, ob bool
	var da, ra, db, rb float64
	if _, err := fmt.Sscanf(a, "%t %f %f", &oa, &da, &ra); err != nil {
		return false
	}
	if _, err := fmt.Sscanf(b, "%t %f %f", &ob, &db, &rb); err != nil {
		return false
	}
	return oa == ob && math.Abs(da-db) <= 0.002 && math.Abs(ra-rb) <= 0.002
}
