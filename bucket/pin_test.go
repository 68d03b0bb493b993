package bucket_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
)

// TestDisagreeingLimits: two processes that give one key different limits
// never mix them: the lower holds for both while a process uses it, the
// other is warned, and once no process has used the lower for a hold (its
// refill time, 10 s here) the higher takes over. Before, each refilled the
// shared state at its own rate: a fleet half at 1/s and half at 2/s took
// 1.5/s, silently.
func TestDisagreeingLimits(t *testing.T) {
	cr := newClockedRedis(t, epoch)
	ctx := context.Background()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	low := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 1, Burst: 10}, bucket.WithLogger(log))
	high := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 2, Burst: 20}, bucket.WithLogger(log))
	take := func(b bucket.Bucket, key string, n int) int {
		got := 0
		for range n {
			if r, err := b.Reserve(ctx, key, bucket.N(1), 0); err == nil && r.OK {
				got++
			}
		}
		return got
	}

	// The lower comes first: it holds for the higher.
	assert.Equal(t, 5, take(low, "a", 5))
	assert.Equal(t, 5, take(high, "a", 30), "the burst of 10, not of 20")
	assert.Contains(t, logs.String(), "level=WARN")
	assert.Contains(t, logs.String(), "limits a key of this bucket lower than this process does")
	cr.clock.Advance(2 * time.Second)
	assert.Equal(t, 2, take(high, "a", 30), "a refill at 1/s")

	// The lower comes second: it holds at once.
	assert.Equal(t, 20, take(high, "b", 30))
	cr.clock.Advance(time.Second)
	assert.Equal(t, 1, take(low, "b", 30), "its rate")
	cr.clock.Advance(2 * time.Second)
	assert.Equal(t, 2, take(high, "b", 30), "held to 1/s")

	// Nobody uses the lower for its hold: the higher takes over.
	cr.clock.Advance(11 * time.Second)
	assert.Equal(t, 20, take(high, "b", 30))
	cr.clock.Advance(time.Second)
	assert.Equal(t, 2, take(high, "b", 30), "its own rate again")

	// Rate and burst are held apart: the lowest of each, for as long as a
	// process has it.
	slow := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 1, Burst: 40})
	narrow := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 4, Burst: 8})
	assert.Equal(t, 8, take(slow, "c", 8))
	assert.Equal(t, 8, take(narrow, "c", 10), "the 32 left, cut to the lower burst")
	cr.clock.Advance(4 * time.Second)
	assert.Equal(t, 4, take(slow, "c", 50)+take(narrow, "c", 50), "a refill at 1/s")
	cr.clock.Advance(20 * time.Second) // narrow's hold (2 s) is long past; slow's (40 s) is not
	assert.Equal(t, 20, take(slow, "c", 50), "its own burst, at 1/s")
}

// Agreeing processes write the pins once a half hold at most.
func TestAgreeingLimits(t *testing.T) {
	cr := newClockedRedis(t, epoch)
	a := bucket.NewRedis(cr.rdb, bucket.PerSecond(100))
	b := bucket.NewRedis(cr.rdb, bucket.PerSecond(100))
	for range 10 {
		_, err := a.Reserve(context.Background(), "k", bucket.N(1), 0)
		require.NoError(t, err)
		_, err = b.Reserve(context.Background(), "k", bucket.N(1), 0)
		require.NoError(t, err)
	}
	tokens, err := b.Tokens(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 80.0, tokens[bucket.Requests])
	fields, err := cr.HKeys("sluice:{k}:requests")
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"t", "ts", "x", "i", "cr", "crx", "cb", "cbx"}, fields) // i: when the hash was made
	assert.Equal(t, cr.HGet("sluice:{k}:requests", "crx"), cr.HGet("sluice:{k}:requests", "cbx"))
	assert.Equal(t, "1796040001123456", cr.HGet("sluice:{k}:requests", "crx"), "written by the first call only")
}

// A refund that fills the key again must not drop the lower limit's pin:
// adjust deleted a full hash, pin and all, and the next process with a
// higher limit found the key full at its own burst.
func TestPinSurvivesRefundToFull(t *testing.T) {
	cr := newClockedRedis(t, epoch)
	ctx := context.Background()
	low := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 1, Burst: 10})
	high := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 10, Burst: 100})
	r, err := low.Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	require.True(t, r.OK)
	require.NoError(t, low.Adjust(ctx, "k", bucket.N(-1)), "a cancelled call's refund")
	r, err = high.Reserve(ctx, "k", bucket.N(100), 0)
	require.NoError(t, err)
	assert.False(t, r.OK, "the low process used the key within its hold: a burst of 10 holds for all")
	got := 0
	for range 100 {
		if r, err := high.Reserve(ctx, "k", bucket.N(1), 0); err == nil && r.OK {
			got++
		}
	}
	assert.Equal(t, 10, got)
}

// A process that only gets refusals uses the key as much as one that is
// admitted: its lower limit must take hold. Before, a refusal wrote
// nothing, so a higher-limited process that kept the key empty kept its
// own rate for ever and starved the lower one.
func TestPinOfARefusedProcess(t *testing.T) {
	cr := newClockedRedis(t, epoch)
	ctx := context.Background()
	low := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 1, Burst: 10})
	high := bucket.NewRedis(cr.rdb, bucket.Limit{Rate: 10, Burst: 100})
	take := func(b bucket.Bucket, n int) int {
		got := 0
		for range n {
			if r, err := b.Reserve(ctx, "k", bucket.N(1), 0); err == nil && r.OK {
				got++
			}
		}
		return got
	}
	require.Equal(t, 100, take(high, 200))
	assert.Equal(t, 0, take(low, 1), "the key is empty")
	highGot := 0
	for range 10 {
		cr.clock.Advance(time.Second)
		highGot += take(high, 20)
		take(low, 1)
	}
	assert.LessOrEqual(t, highGot, 10+1, "held to the low process's 1/s once it asked")
}
