package bucket

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// countingLocal is a Local whose reads of the end of the queue are
// counted.
type countingLocal struct {
	*Local
	reads atomic.Int64
}

func (c *countingLocal) earliest(ctx context.Context, key string, cost Cost) (queue, error) {
	c.reads.Add(1)
	return c.Local.earliest(ctx, key, cost)
}

// TestLocalWaiterReadsOnlyAtRefunds: a Local's waiter hears of every
// refund to its key, which are all this process's, so it never reads the
// end of the queue unasked: a wait of 1.5 s with no refund reads nothing,
// and one refund makes one read.
func TestLocalWaiterReadsOnlyAtRefunds(t *testing.T) {
	b := &countingLocal{Local: NewLocal(Limit{Rate: 10, Burst: 20})}
	ctx := context.Background()
	if _, err := b.Reserve(ctx, "k", N(20), 0); err != nil { // empty
		t.Fatal(err)
	}
	r, err := WaitMax(ctx, b, "k", N(15), time.Minute)
	if err != nil || r.Delay < time.Second {
		t.Fatalf("%+v, %v", r, err)
	}
	if n := b.reads.Load(); n != 0 {
		t.Errorf("%d reads of the end of the queue with no refund, want none", n)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := WaitMax(ctx, b, "k", N(10), time.Minute); err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(50 * time.Millisecond)
	if err := b.Adjust(ctx, "k", N(-5)); err != nil {
		t.Fatal(err)
	}
	<-done
	if n := b.reads.Load(); n != 1 {
		t.Errorf("%d reads for one refund, want 1", n)
	}
}
