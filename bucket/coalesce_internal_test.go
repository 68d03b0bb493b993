package bucket

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestBatchDecidesAsSerialCalls pins the batch's exactness: reservations
// of mixed costs (some charging one dimension of two, some none of a
// dimension another charges), maxWaits and outcomes (taken now, waited,
// refused, waits that may move up), decided in one call, get exactly what
// the same reservations get as calls of their own one after another, on a
// Redis whose clock stands still: the same waits, refusals, epochs and
// places, and the key ends with the same tokens.
func TestBatchDecidesAsSerialCalls(t *testing.T) {
	srv, _ := redistest.Clocked(t, time.Date(2026, 11, 30, 12, 0, 0, 123456000, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	r := NewRedis(rdb, Limit{Rate: 10, Burst: 5}, WithLimit(Tokens, Limit{Rate: 100, Burst: 50}))

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
		res, place, _, err := r.scripted.reserveBy(ctx, reserveScript, "serial", c.cost, c.maxWait, r.span, r.flags())
		serial[i] = outcome{res, place, err}
	}
	batch := make([]*pending, len(calls))
	for i, c := range calls {
		a, err := r.amounts("batch", c.cost)
		require.NoError(t, err)
		batch[i] = &pending{ctx: ctx, cost: c.cost, maxWait: c.maxWait, amounts: a, ch: make(chan []*pending, 1)}
	}
	calls0 := redistest.ScriptCalls(t, rdb)
	r.runBatch("batch", batch)
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
	assert.Len(t, kinds, 4, "every kind of outcome")
	ts, err := r.Tokens(ctx, "serial")
	require.NoError(t, err)
	tb, err := r.Tokens(ctx, "batch")
	require.NoError(t, err)
	assert.Equal(t, ts, tb)
}
