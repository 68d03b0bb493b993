package bucket

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestCredit: what a dimension's credit (f) and the provider's bucket's
// (fp) count, on a real Redis: the refunds of served calls (Settle), not
// those of Adjust, which may be a reservation's never served; every debit;
// what a pause or a report's remaining takes beyond time; and a provider's
// bucket seeded anew starts a new life (i). Redis's clock stands still,
// so that nothing refills between the steps (on a loaded machine 4.5 s
// passed between the first reservation and the refund of 100).
func TestCredit(t *testing.T) {
	srv, _ := redistest.Clocked(t, time.Unix(1_800_000_000, 0))
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	b := NewRedis(rdb, Limit{Rate: 10, Burst: 100}, WithFailClosed(), WithRedisTimeout(5*time.Second))
	ctx := context.Background()
	key := t.Name() + time.Now().Format("150405.000000")
	dim := b.dimKey(b.baseKey(key), Requests)
	field := func(f string) float64 {
		v, err := rdb.HGet(ctx, dim, f).Result()
		if err != nil {
			return 0
		}
		n, err := strconv.ParseFloat(v, 64)
		require.NoError(t, err)
		return n / 1e6
	}
	life := func() int64 {
		n, err := rdb.HGet(ctx, dim, "i").Int64()
		require.NoError(t, err)
		return n
	}
	_, err := b.Reserve(ctx, key, N(100), 0) // empty
	require.NoError(t, err)
	require.NoError(t, Settle(ctx, b, key, N(-30)))
	assert.Equal(t, 30.0, field("f"), "a served refund")
	require.NoError(t, b.Adjust(ctx, key, N(-20)))
	assert.Equal(t, 30.0, field("f"), "an Adjust refund")
	require.NoError(t, b.Adjust(ctx, key, N(5)))
	assert.Equal(t, 25.0, field("f"), "a debit")
	require.NoError(t, Settle(ctx, b, key, N(5)))
	assert.Equal(t, 20.0, field("f"), "a served debit")
	require.NoError(t, Settle(ctx, b, key, N(-100)))
	assert.InDelta(t, 20+60, field("f"), 0.2, "a refund, up to the burst: from 40 to 100")

	// A pause empties the key at its end: what time would have left is
	// taken. Full at 100, a pause of 1 s takes 100 (the 10 it refills would
	// be lost to the burst too).
	require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: time.Second}))
	assert.InDelta(t, 80-100, field("f"), 0.2, "a pause")

	// A report seeds the provider's bucket: a life; its remaining then
	// takes from it.
	q := adaptive.Quota{Limit: 100, Remaining: 60, Reset: 4 * time.Second, Window: 10 * time.Second}
	born := life() // when the hash was made
	require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.Accepted, Quotas: map[string]adaptive.Quota{Requests: q}}))
	assert.Equal(t, born+1, life(), "a new life")
	assert.Equal(t, 0.0, field("fp"))
	q.Remaining = 40
	require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.Accepted, Quotas: map[string]adaptive.Quota{Requests: q}}))
	assert.InDelta(t, -20, field("fp"), 0.5, "a remaining below the provider's bucket")
	require.NoError(t, Settle(ctx, b, key, N(-10)))
	assert.InDelta(t, -10, field("fp"), 0.5, "a served refund to the provider's bucket")
}

// TestLocalCredit: a Local's credits count what Redis's do.
func TestLocalCredit(t *testing.T) {
	b := NewLocal(Limit{Rate: 10, Burst: 100}, WithClock(frozenClock(time.Unix(1000, 0))))
	ctx := context.Background()
	const key = "k"
	credit := func(j int) float64 { // j: 0 the tokens' credit, 1 the provider's bucket's
		b.mu.Lock()
		defer b.mu.Unlock()
		c := b.keys[key].dims[0].credit
		if j == 1 {
			c = b.keys[key].dims[0].providerCredit
		}
		return float64(millionths(c)) / 1e6
	}
	_, err := b.Reserve(ctx, key, N(100), 0)
	require.NoError(t, err)
	require.NoError(t, b.Settle(ctx, key, N(-30)))
	assert.Equal(t, 30.0, credit(0), "a served refund")
	require.NoError(t, b.Adjust(ctx, key, N(-20)))
	assert.Equal(t, 30.0, credit(0), "an Adjust refund")
	require.NoError(t, b.Adjust(ctx, key, N(5)))
	assert.Equal(t, 25.0, credit(0), "a debit")
	require.NoError(t, b.Settle(ctx, key, N(-100)))
	assert.Equal(t, 25.0+55, credit(0), "a refund, up to the burst: from 45 to 100")
	require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: time.Second}))
	assert.Equal(t, 80.0-100, credit(0), "a pause")
	life := func() uint64 {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.keys[key].life
	}
	born := life()
	q := adaptive.Quota{Limit: 100, Remaining: 60, Reset: 4 * time.Second, Window: 10 * time.Second}
	require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.Accepted, Quotas: map[string]adaptive.Quota{Requests: q}}))
	assert.Equal(t, born+1, life(), "a new life")
	q.Remaining = 40
	require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.Accepted, Quotas: map[string]adaptive.Quota{Requests: q}}))
	assert.Equal(t, -20.0, credit(1), "a remaining below the provider's bucket")
	require.NoError(t, b.Settle(ctx, key, N(-10)))
	assert.Equal(t, -10.0, credit(1), "a served refund to the provider's bucket")
}

// frozenClock is a Clock whose time never moves.
type frozenClock time.Time

func (c frozenClock) Now() time.Time { return time.Time(c) }

// TestCreditStartsAgain: a credit beyond what a double holds exactly
// starts again from 0 with a new life, which no waiter reads across.
func TestCreditStartsAgain(t *testing.T) {
	rdb := redistest.Client(t)
	b := NewRedis(rdb, Limit{Rate: 10, Burst: 100}, WithFailClosed())
	ctx := context.Background()
	key := t.Name() + time.Now().Format("150405.000000")
	dim := b.dimKey(b.baseKey(key), Requests)
	_, err := b.Reserve(ctx, key, N(100), 0)
	require.NoError(t, err)
	born, err := rdb.HGet(ctx, dim, "i").Int64() // when the hash was made
	require.NoError(t, err)
	require.NoError(t, rdb.HSet(ctx, dim, "f", 1<<52-1).Err())
	require.NoError(t, Settle(ctx, b, key, N(-1)))
	v, err := rdb.HMGet(ctx, dim, "f", "i").Result()
	require.NoError(t, err)
	assert.Equal(t, []any{"0", strconv.FormatInt(born+1, 10)}, v)
}

// TestMovedTo: the rule a waiter moves up by, constraint by constraint.
func TestMovedTo(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	c := func(slot, from float64, credit int64, rate float64, life string) constraint {
		return constraint{ok: true, at: at(slot), from: at(from), credit: credit, rate: rate, life: life}
	}
	none := constraint{}
	cases := []struct {
		name  string
		place []constraint
		q     queue
		want  float64
	}{
		{"no places: the end", nil, queue{end: at(3)}, 3},
		{"no places: the slot", nil, queue{end: at(9)}, 5},
		{"credit", []constraint{c(5, 0, 0, 10, "0"), none},
			queue{cons: []constraint{c(9, 0, 20e6, 10, "0"), none}}, 3},
		{"the end sooner", []constraint{c(5, 0, 0, 10, "0"), none},
			queue{cons: []constraint{c(1, 0, 20e6, 10, "0"), none}}, 1},
		{"not into a pause", []constraint{c(5, 0, 0, 10, "0"), none},
			queue{cons: []constraint{c(9, 4, 20e6, 10, "0"), none}}, 4},
		{"a debit: no move", []constraint{c(5, 0, 0, 10, "0"), none},
			queue{cons: []constraint{c(9, 0, -20e6, 10, "0"), none}}, 5},
		{"a new life: no move", []constraint{c(5, 0, 0, 10, "0"), none},
			queue{cons: []constraint{c(9, 0, 20e6, 10, "1"), none}}, 5},
		{"the higher rate", []constraint{c(5, 0, 0, 10, "0"), none},
			queue{cons: []constraint{c(9, 0, 20e6, 20, "0"), none}}, 4},
		{"the latest constraint", []constraint{c(5, 0, 0, 10, "0"), c(5, 0, 0, 10, "0")},
			queue{cons: []constraint{c(9, 0, 20e6, 10, "0"), c(9, 0, 10e6, 10, "0")}}, 4},
		{"a provider's bucket since: its end", []constraint{c(5, 0, 0, 10, "0"), none},
			queue{cons: []constraint{c(9, 0, 40e6, 10, "0"), c(4.5, 0, 0, 10, "0")}}, 4.5},
		{"a credit beyond any wait", []constraint{c(5, 0, 0, 1e-6, "0"), none},
			queue{cons: []constraint{c(9, 0, math.MaxInt64, 1e-6, "0"), none}}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := movedTo(at(5), tc.place, tc.q)
			assert.Equal(t, at(tc.want), later(got, t0), "%v", got.Sub(t0))
		})
	}
}

// FuzzPlaces: a reply of a place that the scripts never give is an error,
// and a place read is never before the reply nor has a negative rate; a
// pin's end, if any, is after it.
func FuzzPlaces(f *testing.F) {
	f.Add(int64(2000000), "0", int64(10000000), int64(0), int64(-1), "0", int64(0), "0", int64(0))
	f.Add(int64(5), "-12", int64(1), int64(3), int64(7), "1e9", int64(2), "x", int64(1000000))
	f.Add(int64(5), "0", int64(1), int64(3), int64(7), "0", int64(2), "1", int64(-1))
	f.Fuzz(func(t *testing.T, w int64, credit string, rate, from, wp int64, pcredit string, prate int64, life string, pin int64) {
		at := time.Unix(1000, 0)
		cs, err := places([]any{w, credit, rate, from, wp, pcredit, prate, life, pin}, at)
		if err != nil {
			assert.True(t, w < 0 || rate < 0 || from < 0 || wp < -1 || prate < 0 || pin < 0 ||
				!isInt(credit) || !isInt(pcredit), "a valid place refused: %v", err)
			return
		}
		require.Len(t, cs, 2)
		for _, c := range cs {
			assert.False(t, c.at.Before(at) || c.from.Before(at), "%+v", c)
			assert.GreaterOrEqual(t, c.rate, 0.0)
		}
		assert.Equal(t, pin > 0, !cs[0].pinned.IsZero(), "a pin's end read as it was given")
		assert.True(t, pin <= 0 || cs[0].pinned.After(at), "%v", cs[0].pinned)
		m := movedTo(at.Add(time.Hour), cs, queue{cons: cs})
		assert.False(t, m.After(at.Add(time.Hour)), "moved later")
	})
}

// TestPlaceThresholdIsMinMoveUp: the reserve script gives a place to the
// waits that may move up, those of minMoveUp or more.
func TestPlaceThresholdIsMinMoveUp(t *testing.T) {
	assert.Contains(t, reserveScript.src, "if wait >= "+strconv.FormatInt(minMoveUp.Microseconds(), 10)+" then")
}

// isInt reports whether s is a credit the scripts could write: an integer.
func isInt(s string) bool {
	_, err := strconv.ParseInt(s, 10, 64)
	return err == nil
}
