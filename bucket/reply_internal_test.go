package bucket

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
)

// replyOf is a go-redis reply of v.
func replyOf(v any) *redis.Cmd {
	cmd := redis.NewCmd(context.Background())
	cmd.SetVal(v)
	return cmd
}

// TestReservationReplies: every form the reserve scripts reply is read,
// and anything else, a proxy's or a server's bug, is an error, never a
// wait, an epoch or a place made up.
func TestReservationReplies(t *testing.T) {
	ok := []struct {
		v     any
		dims  int
		w     int64
		epoch uint64
		held  bool
		at    place
	}{
		{int64(0), 1, 0, 0, false, nil},
		{int64(-5), 1, -5, 0, false, nil},
		{[]any{int64(7), int64(3)}, 1, 7, 3, false, nil},
		{[]any{int64(7), int64(3), int64(1)}, 1, 7, 3, true, nil},
		{[]any{int64(300000), int64(0), int64(0), int64(12)}, 1, 300000, 0, false, place{12}},
		{[]any{int64(300000), int64(2), int64(1), int64(0), int64(queueMod - 1)}, 2, 300000, 2, true, place{0, queueMod - 1}},
	}
	for _, c := range ok {
		w, epoch, held, at, err := reservation(replyOf(c.v), c.dims)
		if assert.NoError(t, err, "%v", c.v) {
			assert.Equal(t, []any{c.w, c.epoch, c.held, c.at}, []any{w, epoch, held, at}, "%v", c.v)
		}
	}
	for _, v := range []any{
		"1", []any{}, []any{int64(1)}, []any{"1", int64(0)}, []any{int64(1), int64(-1)},
		[]any{int64(1), int64(0), int64(2)},                     // held is 0 or 1
		[]any{int64(1), int64(0), int64(0)},                     // a place per dimension
		[]any{int64(1), int64(0), int64(0), int64(1), int64(2)}, // one too many
		[]any{int64(1), int64(0), int64(0), int64(-1)},          // a place is a count
		[]any{int64(1), int64(0), int64(0), int64(queueMod)},
		[]any{int64(-1), int64(0), int64(0), int64(1)}, // a refusal has no place
		[]any{int64(1), int64(0), int64(0), "1"},
	} {
		_, _, _, at, err := reservation(replyOf(v), 1)
		assert.Error(t, err, "%#v", v)
		assert.Nil(t, at)
	}
}

// FuzzReservation: no reply panics the reader, and a place it reads is
// one per dimension, each a count below queueMod.
func FuzzReservation(f *testing.F) {
	f.Add(int64(300000), int64(1), int64(0), int64(5), int64(9), 2)
	f.Add(int64(-1), int64(-1), int64(3), int64(-5), int64(queueMod), 1)
	f.Fuzz(func(t *testing.T, w, e, held, p1, p2 int64, n int) {
		n = min(max(n, 0), 4)
		v := []any{w, e, held, p1, p2}[:min(n+3, 5)]
		_, _, _, at, err := reservation(replyOf(v), n)
		if err != nil {
			return
		}
		for _, p := range at {
			if p < 0 || p >= queueMod {
				t.Fatalf("place %d from %v", p, v)
			}
		}
		if at != nil && len(at) != n {
			t.Fatalf("%d places for %d dimensions", len(at), n)
		}
	})
}
