package bucket_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
)

// TestRoute: each key is charged to its class's bucket, the default's if
// its class has none.
func TestRoute(t *testing.T) {
	clk := &fakeClock{t: epoch}
	big := bucket.NewLocal(bucket.PerSecond(10), bucket.WithClock(clk))
	small := bucket.NewLocal(bucket.PerSecond(2), bucket.WithClock(clk))
	def := bucket.NewLocal(bucket.PerSecond(1), bucket.WithClock(clk))
	model := func(key string) string { _, m, _ := strings.Cut(key, "/"); return m }
	b := bucket.Route(model, map[string]bucket.Bucket{"big": big, "small": small}, def)
	ctx := context.Background()
	admitted := func(key string) int {
		n := 0
		for range 20 {
			if r, err := b.Reserve(ctx, key, bucket.N(1), 0); err == nil && r.OK {
				n++
			}
		}
		return n
	}
	assert.Equal(t, 10, admitted("org/big"))
	assert.Equal(t, 2, admitted("org/small"))
	assert.Equal(t, 1, admitted("org/other"))
	assert.Equal(t, 1, admitted("org"))
	require.NoError(t, b.Adjust(ctx, "org/small", bucket.N(-1)))
	assert.Equal(t, 1.0, small.Tokens("org/small")[bucket.Requests])
	require.NoError(t, b.Observe(ctx, "org/big", adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: time.Second}))
	clk.Advance(500 * time.Millisecond)
	assert.LessOrEqual(t, big.Tokens("org/big")[bucket.Requests], 0.0, "paused")
	assert.Equal(t, 2.0, small.Tokens("org/small")[bucket.Requests], "not paused: refilled")
	assert.Same(t, big, b.For("x/big"))
	assert.Panics(t, func() { bucket.Route(nil, nil, def) })
	assert.Panics(t, func() { bucket.Route(model, map[string]bucket.Bucket{"x": nil}, def) })
}
