package bucket

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestBatchDecidesAsSerialCalls pins the batch's exactness: reservations
// of mixed costs (some charging one dimension of two, some none of a
// dimension another charges), maxWaits and outcomes (taken now, waited,
// refused, waits that may move up), decided in one call, get exactly what
// the same reservations get as calls of their own one after another, on a
// Redis whose clock stands still: the same waits, refusals, epochs and
// places, and the key ends with the same tokens. So on a key in each state
// that a batch reads and writes other than its tokens: a provider's
// bucket, a cap, a report that has run its time (the batch's first folds
// it), a lower limit pinned by another process (held), a pause, a
// decrease, a debt.
func TestBatchDecidesAsSerialCalls(t *testing.T) {
	srv, clock := redistest.Clocked(t, time.Date(2026, 11, 30, 12, 0, 0, 123456000, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	r := NewRedis(rdb, Limit{Rate: 10, Burst: 5}, WithLimit(Tokens, Limit{Rate: 100, Burst: 50}))
	lower := NewRedis(rdb, Limit{Rate: 8, Burst: 4}, WithLimit(Tokens, Limit{Rate: 90, Burst: 40}))
	observe := func(fb adaptive.Feedback) func(*testing.T, string) {
		return func(t *testing.T, key string) { require.NoError(t, r.Observe(ctx, key, fb)) }
	}
	reserve := func(b *Redis, cost Cost, times int) func(*testing.T, string) {
		return func(t *testing.T, key string) {
			for range times {
				_, err := b.Reserve(ctx, key, cost, Unlimited)
				require.NoError(t, err)
			}
		}
	}
	provider := adaptive.Feedback{Quotas: map[string]adaptive.Quota{
		Requests: {Limit: 8, Remaining: 6, Window: 10 * time.Second},
		Tokens:   {Limit: 40, Remaining: 30, Window: 10 * time.Second}}}
	for _, c := range []struct {
		name    string
		setup   func(t *testing.T, key string)
		advance time.Duration // after the setup of both keys
	}{
		{name: "fresh", setup: func(*testing.T, string) {}},
		{name: "provider", setup: observe(provider)},
		{name: "cap", setup: observe(adaptive.Feedback{Quotas: map[string]adaptive.Quota{
			Requests: {Limit: 20, Remaining: -1, Window: 10 * time.Second}}})},
		{name: "report-ended", setup: func(t *testing.T, key string) {
			observe(provider)(t, key)
			reserve(r, Cost{Requests: 5, Tokens: 40}, 2)(t, key)
		}, advance: 12 * time.Second},
		{name: "pinned-lower", setup: reserve(lower, N(1), 1)},
		{name: "paused", setup: observe(adaptive.Feedback{Class: adaptive.RateLimited, HasRetryAfter: true, RetryAfter: 500 * time.Millisecond})},
		{name: "decreased", setup: observe(adaptive.Feedback{Class: adaptive.RateLimited, Epoch: 1 << 40})},
		{name: "debt", setup: reserve(r, Cost{Requests: 5, Tokens: 40}, 2)},
	} {
		t.Run(c.name, func(t *testing.T) {
			serialKey, batchKey := "serial-"+c.name, "batch-"+c.name
			c.setup(t, serialKey)
			c.setup(t, batchKey)
			clock.Advance(c.advance)
			kinds := batchMatchesSerial(t, r, serialKey, batchKey)
			if c.name == "fresh" {
				assert.Len(t, kinds, 4, "every kind of outcome")
			}
		})
	}
}

// batchMatchesSerial reserves the same calls on serialKey, each as a call
// of its own, and on batchKey, in one batch, and checks that each gets the
// same outcome and that the keys end the same. It returns the kinds of
// outcome there were, by how many.
func batchMatchesSerial(t *testing.T, r *Redis, serialKey, batchKey string) map[string]int {
	t.Helper()
	ctx := context.Background()
	rdb := r.scripted.rdb.(*redis.Client)
	rng := rand.New(rand.NewPCG(1, 2))
	costs := []Cost{N(1), {Requests: 1, Tokens: 20}, {Tokens: 30}, {Requests: 2, Tokens: 5}, {Requests: 0.5}}
	waits := []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond, time.Second, 3 * time.Second, Unlimited}
	type call struct {
		cost    Cost
		maxWait time.Duration
	}
	calls := make([]call, maxBatch)
	for i := range calls {
		calls[i] = call{costs[rng.IntN(len(costs))], waits[rng.IntN(len(waits))]}
	}
	// A batch's first charging none of a dimension that others charge.
	calls[0].cost = Cost{Tokens: 10}

	type outcome struct {
		r     Reservation
		place []constraint
		err   error
	}
	serial := make([]outcome, len(calls))
	began := time.Now()
	for i, c := range calls {
		res, place, _, err := r.scripted.reserveBy(ctx, reserveScript, serialKey, c.cost, c.maxWait, r.span, r.flags())
		serial[i] = outcome{res, place, err}
	}
	batch := make([]*pending, len(calls))
	for i, c := range calls {
		a, err := r.amounts(batchKey, c.cost)
		require.NoError(t, err)
		batch[i] = &pending{ctx: ctx, cost: c.cost, maxWait: c.maxWait, amounts: a, ch: make(chan []*pending, 1)}
	}
	calls0 := redistest.ScriptCalls(t, rdb)
	r.runBatch(batchKey, batch)
	apart := time.Since(began) // the most the moments the places were read at lie apart
	assert.Equal(t, int64(1), redistest.ScriptCalls(t, rdb)-calls0, "one script call for the batch")

	kinds := map[string]int{}
	for i, p := range batch {
		s := serial[i]
		require.NoError(t, s.err)
		require.NoError(t, p.err, "reservation %d", i)
		assert.Equal(t, s.r, p.r, "reservation %d (%v, maxWait %v)", i, calls[i].cost, calls[i].maxWait)
		require.Len(t, p.place, len(s.place), "reservation %d's place", i)
		for j, c := range s.place {
			b := p.place[j]
			assert.Equal(t, c.ok, b.ok)
			assert.Equal(t, c.credit, b.credit)
			assert.Equal(t, c.rate, b.rate)
			assert.Equal(t, c.life, b.life)
			// read at different moments of this process's clock
			assert.WithinDuration(t, c.at, b.at, apart)
			assert.WithinDuration(t, c.from, b.from, apart)
		}
		switch {
		case !s.r.OK:
			kinds["refused"]++
		case s.place != nil:
			kinds["may move up"]++
		case s.r.Delay > 0:
			kinds["waits"]++
		default:
			kinds["now"]++
		}
	}
	t.Logf("outcomes: %v", kinds)
	ts, err := r.Tokens(ctx, serialKey)
	require.NoError(t, err)
	tb, err := r.Tokens(ctx, batchKey)
	require.NoError(t, err)
	assert.Equal(t, ts, tb)
	// and the same hashes
	for _, d := range []string{Requests, Tokens} {
		hs := rdb.HGetAll(ctx, r.scripted.dimKey(r.scripted.baseKey(serialKey), d)).Val()
		hb := rdb.HGetAll(ctx, r.scripted.dimKey(r.scripted.baseKey(batchKey), d)).Val()
		assert.Equal(t, hs, hb, d)
	}
	return kinds
}
