package bucket

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestBatchMatchesSerialRandomized: on keys brought to random states
// (provider's buckets, caps, burst-only reports, reports run their time,
// pauses, decreases, debts, refunds, pins of a lower and a higher process,
// the clock moved on or back), with limits whose refill times are not
// whole microseconds, windows and cold starts, a random batch of up to 64
// reservations decided in one call gets exactly the raw replies the same
// reservations get as calls of their own, and every hash and its PTTL end
// the same. 300 trials; SLUICE_BATCH_TRIALS=n runs n (35,000 over seven
// seeds found nothing in December 2026), SLUICE_BATCH_SEED another seed.
func TestBatchMatchesSerialRandomized(t *testing.T) {
	seed, trials := uint64(12), 300
	if v := os.Getenv("SLUICE_BATCH_SEED"); v != "" {
		if _, err := fmt.Sscan(v, &seed); err != nil {
			t.Fatalf("SLUICE_BATCH_SEED: %v", err)
		}
	}
	if v := os.Getenv("SLUICE_BATCH_TRIALS"); v != "" {
		if _, err := fmt.Sscan(v, &trials); err != nil {
			t.Fatalf("SLUICE_BATCH_TRIALS: %v", err)
		}
	}
	srv, clock := redistest.Clocked(t, time.Date(2026, 11, 30, 12, 0, 0, 123456000, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	type cfg struct {
		req, tok, wreq Limit
		lreq, ltok     Limit
		window         bool
	}
	cfgs := []cfg{
		{req: Limit{10, 5}, tok: Limit{100, 50}, lreq: Limit{8, 4}, ltok: Limit{90, 40}},
		{req: Limit{3, 10}, tok: Limit{7, 13}, lreq: Limit{2.9, 9.7}, ltok: Limit{6.1, 11}},
		{req: Limit{0.3, 2}, tok: Limit{33, 7}, lreq: Limit{0.29, 1.9}, ltok: Limit{31, 6.9}},
		{req: Limit{10, 5}, tok: Limit{100, 50}, lreq: Limit{8, 4}, ltok: Limit{90, 40}, window: true, wreq: Limit{1.0 / 7, 20}},
		{req: Limit{3, 10}, tok: Limit{7, 13}, lreq: Limit{3, 9.7}, ltok: Limit{7, 11}, window: true, wreq: Limit{0.3, 12}},
	}
	fails := 0
	kinds := map[string]int{}
	defer func() {
		t.Logf("kinds %v", kinds)
		for _, k := range []string{"refused", "wait", "place", "held", "cold", "fractional", "folded", "provider", "credit"} {
			assert.Positive(t, kinds[k], "no trial had %s: the states drawn miss a case", k)
		}
	}()
	for trial := 0; trial < trials && fails < 5; trial++ {
		rng := rand.New(rand.NewPCG(seed, uint64(trial)))
		c := cfgs[rng.IntN(len(cfgs))]
		opts := []Option{WithLimit(Tokens, c.tok)}
		lopts := []Option{WithLimit(Tokens, c.ltok)}
		if c.window {
			opts = append(opts, WithWindow(Requests, c.wreq))
			lopts = append(lopts, WithWindow(Requests, c.wreq))
		}
		r := NewRedis(rdb, c.req, opts...)
		lower := NewRedis(rdb, c.lreq, lopts...)
		hopts := []Option{WithLimit(Tokens, Limit{c.tok.Rate * 1.3, c.tok.Burst * 1.1})}
		if c.window {
			hopts = append(hopts, WithWindow(Requests, c.wreq))
		}
		higher := NewRedis(rdb, Limit{c.req.Rate * 1.7, c.req.Burst}, hopts...)
		sk, bk := fmt.Sprintf("s%d", trial), fmt.Sprintf("b%d", trial)
		var log []string
		steps := rng.IntN(5)
		for range steps {
			var do func(key string) error
			switch rng.IntN(10) {
			case 9:
				cost := Cost{Requests: c.req.Burst * rng.Float64(), Tokens: c.tok.Burst * rng.Float64()}
				log = append(log, fmt.Sprintf("higher %v", cost))
				do = func(key string) error { _, err := higher.Reserve(ctx, key, cost, Unlimited); return err }
			case 0:
				fb := adaptive.Feedback{Quotas: map[string]adaptive.Quota{
					Requests: {Limit: c.req.Burst * 0.8, Remaining: c.req.Burst * 0.5, Window: time.Duration(1+rng.IntN(10)) * time.Second},
					Tokens:   {Limit: c.tok.Burst * 0.7, Remaining: c.tok.Burst * 0.3, Window: time.Duration(1+rng.IntN(10)) * time.Second}}}
				log = append(log, "provider")
				do = func(key string) error { return r.Observe(ctx, key, fb) }
			case 1:
				fb := adaptive.Feedback{Quotas: map[string]adaptive.Quota{
					Requests: {Limit: c.req.Burst * 3, Remaining: -1, Window: time.Duration(1+rng.IntN(10)) * time.Second}}}
				log = append(log, "cap")
				do = func(key string) error { return r.Observe(ctx, key, fb) }
			case 2:
				fb := adaptive.Feedback{Class: adaptive.RateLimited, HasRetryAfter: true, RetryAfter: time.Duration(rng.IntN(2000)) * time.Millisecond}
				log = append(log, "pause")
				do = func(key string) error { return r.Observe(ctx, key, fb) }
			case 3:
				fb := adaptive.Feedback{Class: adaptive.RateLimited, Epoch: 1 << 40}
				log = append(log, "decrease")
				do = func(key string) error { return r.Observe(ctx, key, fb) }
			case 4:
				cost := Cost{Requests: c.req.Burst * rng.Float64(), Tokens: c.tok.Burst * rng.Float64()}
				log = append(log, fmt.Sprintf("reserve %v", cost))
				do = func(key string) error { _, err := r.Reserve(ctx, key, cost, Unlimited); return err }
			case 5:
				cost := Cost{Requests: c.lreq.Burst * rng.Float64(), Tokens: c.ltok.Burst * rng.Float64()}
				log = append(log, fmt.Sprintf("lower %v", cost))
				do = func(key string) error { _, err := lower.Reserve(ctx, key, cost, Unlimited); return err }
			case 6:
				cost := Cost{Requests: -c.req.Burst * rng.Float64() / 3, Tokens: -c.tok.Burst * rng.Float64() / 3}
				log = append(log, fmt.Sprintf("settle %v", cost))
				do = func(key string) error { return r.Settle(ctx, key, cost) }
			case 7:
				fb := adaptive.Feedback{Quotas: map[string]adaptive.Quota{
					Tokens: {Limit: c.tok.Burst * 2, Remaining: c.tok.Burst * 0.1, Window: time.Duration(1+rng.IntN(10)) * time.Second}}}
				log = append(log, "provider-tokens-big")
				do = func(key string) error { return r.Observe(ctx, key, fb) }
			case 8:
				fb := adaptive.Feedback{Quotas: map[string]adaptive.Quota{
					Requests: {Limit: c.req.Burst * 0.5, Remaining: -1, Reset: 0},
					Tokens:   {Limit: -1, Remaining: c.tok.Burst * 0.2}}}
				log = append(log, "burst-only")
				do = func(key string) error { return r.Observe(ctx, key, fb) }
			}
			require.NoError(t, do(sk))
			require.NoError(t, do(bk))
			if rng.IntN(2) == 0 {
				d := time.Duration(rng.IntN(15000)) * time.Millisecond
				if rng.IntN(5) == 0 {
					d = -d / 3
				} else if rng.IntN(3) == 0 {
					d = time.Duration(rng.IntN(1000000)) * time.Microsecond
				}
				log = append(log, fmt.Sprintf("advance %v", d))
				clock.Advance(d)
			}
		}
		cold := rng.IntN(3) == 0
		flags := r.adapt.flags()
		if cold {
			flags = r.adapt.flagsCold()
		}
		n := 2 + rng.IntN(63)
		costs := make([]Cost, n)
		waits := make([]time.Duration, n)
		for i := range costs {
			cost := Cost{}
			switch rng.IntN(4) {
			case 0:
				cost[Requests] = min(float64(1+rng.IntN(3)), c.req.Burst)
			case 1:
				cost[Tokens] = float64(1 + rng.IntN(int(c.tok.Burst)))
			case 2:
				cost[Requests] = rng.Float64() * c.req.Burst
				cost[Tokens] = rng.Float64() * c.tok.Burst
			case 3:
				cost[Requests] = min(0.5, c.req.Burst)
				cost[Tokens] = 3
			}
			costs[i] = cost
			waits[i] = []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond, time.Second, 3 * time.Second, Unlimited}[rng.IntN(6)]
		}
		// serial
		serial := make([]any, n)
		serialErr := make([]error, n)
		for i := range costs {
			argv, _, err := r.scripted.prepare(sk, costs[i], true, false, waitArg(waits[i]), r.span, flags)
			require.NoError(t, err)
			serial[i], serialErr[i] = r.scripted.runArgv(ctx, reserveScript, argv).Result()
		}
		// batch, as runBatch builds it
		batch := make([]*pending, n)
		for i := range costs {
			a, err := r.amounts(bk, costs[i])
			require.NoError(t, err)
			batch[i] = &pending{ctx: ctx, cost: costs[i], maxWait: waits[i], amounts: a}
		}
		keys, args := r.batchArgs(bk, batch, flags)
		v, err := r.scripted.run(ctx, reserveScript, keys, args...).Result()
		desc := fmt.Sprintf("trial %d cfg %+v cold %v setup %v costs %v waits %v", trial, c, cold, log, costs, waits)
		ok := true
		if err != nil {
			t.Errorf("%s: batch failed: %v", desc, err)
			fails++
			continue
		}
		replies := v.([]any)
		for _, rp := range replies {
			switch x := rp.(type) {
			case int64:
				if x < 0 {
					kinds["refused"]++
				} else if x > 0 {
					kinds["wait"]++
				} else {
					kinds["now"]++
				}
			case []any:
				if len(x) > 3 {
					kinds["place"]++
				}
				if len(x) >= 3 && x[2] == int64(1) {
					kinds["held"]++
				}
				if x[0].(int64) < 0 {
					kinds["refused"]++
				}
				if x[1].(int64) > 0 {
					kinds["epoch"]++
				}
			}
		}
		if cold {
			kinds["cold"]++
		}
		for _, d := range dimNames(r) {
			h := rdb.HGetAll(ctx, r.dimKey(keys[0], d)).Val()
			if strings.Contains(h["crx"]+h["cbx"]+h["x"], ".") {
				kinds["fractional"]++
			}
			if h["rx"] != "" && h["r"] == "" && h["b"] == "" {
				kinds["folded"]++
			}
			if h["p"] != "" {
				kinds["provider"]++
			}
			if h["f"] != "" {
				kinds["credit"]++
			}
		}
		for i := range costs {
			if serialErr[i] != nil {
				t.Errorf("%s: serial %d failed: %v", desc, i, serialErr[i])
				ok = false
				continue
			}
			if fmt.Sprint(serial[i]) != fmt.Sprint(replies[i]) {
				t.Errorf("%s: reservation %d: serial %v, batch %v", desc, i, serial[i], replies[i])
				ok = false
			}
		}
		for _, d := range append([]string{""}, dimNames(r)...) {
			ks, kb := r.baseKey(sk), r.baseKey(bk)
			if d != "" {
				ks, kb = r.dimKey(ks, d), r.dimKey(kb, d)
			}
			hs, hb := rdb.HGetAll(ctx, ks).Val(), rdb.HGetAll(ctx, kb).Val()
			if fmt.Sprint(hs) != fmt.Sprint(hb) {
				t.Errorf("%s: hash %q: serial %v, batch %v", desc, d, hs, hb)
				ok = false
			}
			ps, pb := rdb.PTTL(ctx, ks).Val(), rdb.PTTL(ctx, kb).Val()
			if ps != pb {
				t.Errorf("%s: pttl %q: serial %v, batch %v", desc, d, ps, pb)
				ok = false
			}
		}
		if !ok {
			fails++
		}
	}
}

// dimNames returns the names of r's dimensions.
func dimNames(r *Redis) []string {
	var n []string
	for _, d := range r.dims {
		n = append(n, d.name)
	}
	return n
}
