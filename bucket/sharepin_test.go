package bucket_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestShareHeldToTheFleetsPin: three processes share a key at 50/s, one of
// them configured 1,000 times too high (50,000/s); Redis holds it to the
// fleet's 50/s (the pin), and its fail-open share through a 2 s outage
// must be its part of that, not of its own limit: its share ran at its own
// limit and admitted about 33,000 calls (34,950 in the fleet)
// where Burst/n + Rate/n·T allows 51.
func TestShareHeldToTheFleetsPin(t *testing.T) {
	srv := redistest.Own(t)
	clk := &fakeClock{t: time.Now()}
	rdb := fastClient(t, srv.Addr)
	ctx := t.Context()
	const n = 3
	lim := bucket.PerSecond(50)
	var high *bucket.Redis
	for i, l := range []bucket.Limit{lim, lim, {Rate: 1000 * lim.Rate, Burst: 1000 * lim.Burst}} {
		high = bucket.NewRedis(rdb, l, bucket.WithClock(clk), bucket.WithMemberID(string(rune('a'+i))), quickBreaker)
		_, err := high.Reserve(ctx, "k", bucket.N(1), 0)
		require.NoError(t, err)
	}
	clk.Advance(time.Second) // the next call counts the fleet
	r, err := high.Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	require.True(t, r.OK)
	require.Equal(t, int64(n), bucket.Members(high))

	srv.Stop()
	const outage = 2 * time.Second
	const step = 10 * time.Millisecond
	admitted := 0
	for range outage / step {
		clk.Advance(step)
		for range 1000 { // all the share gives at this moment
			r, err := high.Reserve(ctx, "k", bucket.N(1), 0)
			require.NoError(t, err)
			if !r.OK {
				break
			}
			admitted++
		}
	}
	bound := lim.Burst/n + lim.Rate/n*outage.Seconds()
	t.Logf("the process configured at %g/s, in a %v outage: %d admitted; its part of the fleet's %g/s allows %.1f",
		1000*lim.Rate, outage, admitted, lim.Rate, bound)
	assert.LessOrEqual(t, float64(admitted), bound+1)
	assert.Positive(t, admitted, "the share admits its part")
}
