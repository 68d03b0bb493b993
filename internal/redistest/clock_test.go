package redistest_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestClocked pins what a frozen clock is to the server: TIME, in scripts
// too, reads it to the microsecond and moves only with it; a key's PTTL
// counts down with it; a key expires once the clock is a millisecond past
// its expiry, on access (EXISTS, GET, PTTL, KEYS) and in the background.
func TestClocked(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC)
	s, clk := redistest.Clocked(t, start)
	c := client(t, s.Addr, -1)
	at := start.Truncate(time.Microsecond)
	assert.Equal(t, at, clk.Now())

	now, err := c.Time(ctx).Result()
	require.NoError(t, err)
	assert.True(t, at.Equal(now), "TIME %v", now)
	time.Sleep(20 * time.Millisecond)
	now, err = c.Time(ctx).Result()
	require.NoError(t, err)
	assert.True(t, at.Equal(now), "TIME stays frozen: %v", now)

	clk.Advance(1500 * time.Microsecond)
	lua, err := c.Eval(ctx, "return redis.call('TIME')", nil).Slice()
	require.NoError(t, err)
	assert.Equal(t, []any{strconv.FormatInt(at.Unix(), 10), strconv.Itoa(at.Nanosecond()/1000 + 1500)}, lua,
		"TIME in a script")

	// PEXPIRE at ...124 ms (the server's milliseconds are truncated): the
	// key is due at ...1124 ms.
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	require.NoError(t, c.Do(ctx, "PEXPIRE", "k", 1000).Err())
	require.NoError(t, c.Set(ctx, "other", "v", 0).Err())
	require.NoError(t, c.Do(ctx, "PEXPIRE", "other", 1000).Err())
	assert.Equal(t, 1000*time.Millisecond, c.PTTL(ctx, "k").Val())
	clk.Advance(999 * time.Millisecond)
	assert.Equal(t, time.Millisecond, c.PTTL(ctx, "k").Val())
	clk.Advance(time.Millisecond)
	assert.Equal(t, time.Duration(0), c.PTTL(ctx, "k").Val(), "due now: still there")
	assert.Equal(t, int64(1), c.Exists(ctx, "k").Val())
	assert.ElementsMatch(t, []string{"k", "other"}, c.Keys(ctx, "*").Val())
	clk.Advance(time.Millisecond)
	assert.Equal(t, int64(0), c.Exists(ctx, "k").Val(), "a millisecond past due: gone")
	assert.Equal(t, []string{}, c.Keys(ctx, "*").Val(), "KEYS hides expired keys")
	assert.Equal(t, time.Duration(-2), c.PTTL(ctx, "other").Val(), "no such key")
	assert.Equal(t, int64(0), c.Exists(ctx, "other").Val())

	// In the background, no access needed.
	require.NoError(t, c.Set(ctx, "idle", "v", time.Second).Err())
	assert.Equal(t, int64(1), c.DBSize(ctx).Val())
	clk.Advance(2 * time.Second)
	assert.Eventually(t, func() bool { return c.DBSize(ctx).Val() == 0 }, 10*time.Second, 10*time.Millisecond,
		"active expiry deletes the idle key")

	// Back in time, and kept across a restart.
	clk.Set(start.Add(-time.Hour))
	now, err = c.Time(ctx).Result()
	require.NoError(t, err)
	assert.True(t, at.Add(-time.Hour).Equal(now), "TIME %v", now)
	s.Stop()
	require.NoError(t, s.Restart())
	now, err = client(t, s.Addr, -1).Time(ctx).Result()
	require.NoError(t, err)
	assert.True(t, at.Add(-time.Hour).Equal(now), "TIME after a restart %v", now)
}

// TestClockedBeforeTheEpoch: times before 1970 are whole microseconds too.
func TestClockedBeforeTheEpoch(t *testing.T) {
	at := time.Unix(-100, 250_000_000)
	s, _ := redistest.Clocked(t, at)
	now, err := client(t, s.Addr, -1).Time(context.Background()).Result()
	require.NoError(t, err)
	assert.True(t, at.Equal(now), "TIME %v", now)
}
