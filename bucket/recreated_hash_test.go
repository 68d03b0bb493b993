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
