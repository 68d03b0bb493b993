package bucket_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestShortArrayReplyIsAnError: a reserve reply that is an array of fewer
// than two elements (a proxy's, a server's bug) is an error, not a panic:
// reservation read v[0] and v[1] before it checked the length.
func TestShortArrayReplyIsAnError(t *testing.T) {
	for _, reply := range []string{"*0", "*1\r\n:5"} {
		t.Run(reply[:2], func(t *testing.T) {
			fake := startFakeRedis(t, ":0") // the first contact, then a reservation
			b := bucket.NewRedis(fastClient(t, fake.addr), bucket.PerSecond(10), bucket.WithEvictionAllowed(), bucket.WithFailClosed())
			_, err := b.Reserve(t.Context(), "k", bucket.N(1), time.Second)
			require.NoError(t, err)
			fake.reply.Store(&reply)
			require.NotPanics(t, func() { _, err = b.Reserve(t.Context(), "k", bucket.N(1), time.Second) })
			assert.ErrorContains(t, err, "unexpected reply")
		})
	}
}

// TestRecreatedHashGivesNoPhantomCredit: a dimension's hash that Redis
// lost (a restart without persistence, a failover to a replica that had
// not the write, a flush) comes back with no credit and the life it had
// at its creation, 0: a waiter whose place was taken on the lost hash
// read the difference as a credit. At 10/s with a burst of 20, two debits
// of 20 (calls that used more than reserved) leave the credit at -40 and
// are paid for by time (2 s); W then waits for 20 (slot 2 s). Redis
// restarts, and the fleet's other process spends the new hash's burst
// and reserves 20 more (slot 2 s after the restart). At W's first re-read
// it saw a credit of 40 (4 s at 10/s) and went at once: 40 admitted
// within 1 s of W's reservation, where the bucket (old or new) allows 30
// and W's own slot was 2 s off. Before the credit, W kept its slot.
func TestRecreatedHashGivesNoPhantomCredit(t *testing.T) {
	srv := redistest.Own(t)
	l := bucket.Limit{Rate: 10, Burst: 20}
	a := bucket.NewRedis(fastClient(t, srv.Addr), l, bucket.WithFailClosed(), bucket.WithEvictionAllowed(), quickBreaker)
	b := bucket.NewRedis(fastClient(t, srv.Addr), l, bucket.WithFailClosed(), bucket.WithEvictionAllowed(), quickBreaker)
	ctx := context.Background()
	key := uniqueKey(t)
	require.NoError(t, bucket.Settle(ctx, a, key, bucket.N(20))) // debits of served calls
	require.NoError(t, bucket.Settle(ctx, a, key, bucket.N(20)))
	time.Sleep(2 * time.Second) // paid for: the key is empty, its credit -40
	start := time.Now()
	woke := make(chan time.Duration, 1)
	go func() {
		_, err := bucket.WaitMax(ctx, a, key, bucket.N(20), time.Minute) // slot 2 s
		assert.NoError(t, err)
		woke <- time.Since(start)
	}()
	time.Sleep(50 * time.Millisecond)
	srv.Stop()
	require.NoError(t, srv.Restart())
	require.Eventually(t, func() bool {
		r, err := b.Reserve(ctx, key, bucket.N(20), 0) // the new hash's burst
		return err == nil && r.OK
	}, 2*time.Second, 10*time.Millisecond)
	r, err := b.Reserve(ctx, key, bucket.N(20), time.Minute)
	require.NoError(t, err)
	require.Greater(t, r.Delay, 1800*time.Millisecond, "the new queue ends 2 s on")
	w := <-woke
	t.Logf("W woke at %v (its slot: 2 s)", w)
	assert.GreaterOrEqual(t, w, 1900*time.Millisecond,
		"W went %v before its slot, on a credit read across the hash's loss", 2*time.Second-w)
}

// TestCancelledSlotLeavesNoGap: a wait given up (its cost refunded
// through Adjust) hands its capacity to the end of the queue, and a
// waiter of another process behind it, which hears of the refund only at
// its next re-read and then finds the end of the queue already taken,
// keeps its slot: the cancelled slot's capacity is unused where it lay,
// and the next reservation lands on the same slot as that waiter. At 10/s
// with a burst of 20, on an empty key: A (slot 2 s), C (4 s) and, in
// another process, D (6 s) wait for 20 each; C gives up at 1 s; Z
// reserves 20 at 1.1 s and gets 6 s too. D and Z go together: 40 within
// a few milliseconds, where any interval of that length allows 20 and a
// bit. It fails on f96d504 too: the credit does not make it.
func TestCancelledSlotLeavesNoGap(t *testing.T) {
	l := bucket.Limit{Rate: 10, Burst: 20}
	p1 := bucket.NewRedis(redistest.Client(t), l, bucket.WithFailClosed())
	p2 := bucket.NewRedis(redistest.Client(t), l, bucket.WithFailClosed())
	ctx := context.Background()
	key := uniqueKey(t)
	start := time.Now()
	_, err := p1.Reserve(ctx, key, bucket.N(20), 0) // empty
	require.NoError(t, err)
	woke := make(chan time.Duration, 4)
	wait := func(ctx context.Context, b bucket.Bucket) {
		if _, err := bucket.WaitMax(ctx, b, key, bucket.N(20), time.Minute); err == nil {
			woke <- time.Since(start)
		}
	}
	go wait(ctx, p1) // A
	time.Sleep(20 * time.Millisecond)
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(time.Second-time.Since(start), cancel)
	go wait(cctx, p1) // C
	time.Sleep(20 * time.Millisecond)
	go wait(ctx, p2) // D
	time.Sleep(1100*time.Millisecond - time.Since(start))
	go wait(ctx, p1) // Z
	var at []time.Duration
	for range 3 {
		at = append(at, <-woke)
	}
	t.Logf("woke at %v", at)
	gap := at[2] - at[1]
	assert.GreaterOrEqual(t, gap, 1900*time.Millisecond,
		"40 admitted within %v, where the bucket allows %.1f", gap, l.Burst+l.Rate*gap.Seconds())
}
