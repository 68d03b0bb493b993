package bucket_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/redistest"
)

// points is metrictest.Points.
func points(t *testing.T, r *sdkmetric.ManualReader) map[string]float64 {
	return metrictest.Points(t, r)
}

func newReader(t *testing.T) (*sdkmetric.ManualReader, *sdkmetric.MeterProvider) {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	return r, mp
}

// TestMetrics checks every instrument against what a sequence of calls
// did, on both token bucket backends under controlled time.
func TestMetrics(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			reader, mp := newReader(t)
			key := "metrics-" + be.name
			b := be.new(t, bucket.Limit{Rate: 10, Burst: 10}, bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 100, Burst: 1000}),
				bucket.WithMeterProvider(mp))
			ctx := context.Background()
			served := "local"
			if be.name == "redis" {
				served = "redis"
			}
			// 10 requests at once, 1 delayed, 1 refused, 1 error.
			for range 10 {
				r, err := b.Reserve(ctx, key, bucket.Cost{bucket.Requests: 1, bucket.Tokens: 50}, 0)
				require.NoError(t, err)
				require.True(t, r.OK)
			}
			r, err := b.Reserve(ctx, key, bucket.N(1), time.Second)
			require.NoError(t, err)
			require.True(t, r.OK)
			require.Equal(t, 100*time.Millisecond, r.Delay)
			r, err = b.Reserve(ctx, key, bucket.N(1), 0)
			require.NoError(t, err)
			require.False(t, r.OK)
			_, err = b.Reserve(ctx, key, bucket.N(11), 0)
			require.Error(t, err)
			require.NoError(t, b.Adjust(ctx, key, bucket.Cost{bucket.Tokens: -120}))
			require.NoError(t, b.Adjust(ctx, key, bucket.Cost{bucket.Tokens: 30}))
			// In debt by the delayed reservation; the tokens dimension
			// refunded and debited.
			got := points(t, reader)
			assert.Equal(t, -1.0, got["sluice.bucket.tokens.remaining{dimension=requests}"])
			assert.Equal(t, 590.0, got["sluice.bucket.tokens.remaining{dimension=tokens}"])
			assert.Equal(t, 1.0, got["sluice.bucket.rate.fraction{dimension=requests}"])
			// A 429 with a pause, then two more: the third decreases the rate
			// (threshold 3).
			for range 3 {
				require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: 200 * time.Millisecond}))
			}

			got = points(t, reader)
			dec := func(d string) string {
				return fmt.Sprintf("sluice.bucket.decisions{decision=%s,served_by=%s}", d, served)
			}
			want := map[string]float64{
				dec("now"):     10,
				dec("delayed"): 1,
				dec("refused"): 1,
				dec("error"):   1,
				"sluice.bucket.tokens.charged{dimension=requests}":   11,
				"sluice.bucket.tokens.charged{dimension=tokens}":     500,
				"sluice.bucket.tokens.refunded{dimension=tokens}":    120,
				"sluice.bucket.tokens.debited{dimension=tokens}":     30,
				"sluice.bucket.wait.duration{}":                      11,
				"sluice.bucket.pauses{}":                             1, // the later ones end no later
				"sluice.bucket.rate.decreases{}":                     1,
				"sluice.bucket.waiters{}":                            1, // wall clock: the delayed slot is 100 ms off
				"sluice.bucket.tokens.remaining{dimension=requests}": got["sluice.bucket.tokens.remaining{dimension=requests}"],
				"sluice.bucket.tokens.remaining{dimension=tokens}":   got["sluice.bucket.tokens.remaining{dimension=tokens}"],
				"sluice.bucket.rate.fraction{dimension=requests}":    0.7,
				"sluice.bucket.rate.fraction{dimension=tokens}":      0.7,
			}
			// Counters start at zero.
			want["sluice.bucket.tokens.refunded{dimension=requests}"] = 0
			want["sluice.bucket.tokens.debited{dimension=requests}"] = 0
			want["sluice.bucket.limit.low{dimension=requests}"] = 0 // 0.7 is not below half
			want["sluice.bucket.limit.low{dimension=tokens}"] = 0
			if be.name == "redis" {
				want["sluice.bucket.redis.state{}"] = 0
				want["sluice.bucket.members{}"] = 1
				want["sluice.bucket.redis.transitions{state=fail_open}"] = 0
				want["sluice.bucket.redis.transitions{state=serving}"] = 0
			}
			assert.Equal(t, want, got)
			// Paused: empty at its end, as Tokens says.
			assert.Equal(t, be.tokens(t, key)[bucket.Requests], got["sluice.bucket.tokens.remaining{dimension=requests}"])
		})
	}
}

// TestMetricsCardinality: with the defaults, a thousand keys make the same
// series as one; a key label makes at most 32 labels and "other".
func TestMetricsCardinality(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Own(t).Addr})
	t.Cleanup(func() { rdb.Close() })
	series := func(opts ...bucket.Option) map[string]float64 {
		reader, mp := newReader(t)
		b := bucket.NewRedis(rdb, bucket.PerSecond(1000), append(opts, bucket.WithMeterProvider(mp),
			bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 1e6, Burst: 1e6}))...)
		ctx := context.Background()
		for i := range 1000 {
			key := fmt.Sprintf("org-%d/model-%d", i, i%100)
			_, err := b.Reserve(ctx, key, bucket.Cost{bucket.Requests: 1, bucket.Tokens: 10}, time.Second)
			require.NoError(t, err)
			require.NoError(t, b.Adjust(ctx, key, bucket.Cost{bucket.Tokens: -1}))
			require.NoError(t, b.Observe(ctx, key, adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: time.Millisecond}))
		}
		got := points(t, reader)
		t.Logf("1,000 keys: %d points, %d Prometheus series", len(got), metrictest.PromSeries(t, reader))
		if len(opts) == 0 {
			assert.LessOrEqual(t, metrictest.PromSeries(t, reader), 50)
		}
		return got
	}
	got := series()
	for name := range got {
		assert.NotContains(t, name, "key=", name)
		assert.NotContains(t, name, "org-", name)
	}

	got = series(bucket.WithMetricKeyLabel(func(key string) string { return key[strings.IndexByte(key, '/')+1:] }))
	labels := map[string]bool{}
	for name := range got {
		if i := strings.Index(name, "key="); i >= 0 {
			labels[strings.FieldsFunc(name[i+4:], func(r rune) bool { return r == ',' || r == '}' })[0]] = true
		}
	}
	assert.Len(t, labels, 33)
	assert.True(t, labels["other"])
}

// TestMetricAttributes: static attributes are on every measurement.
func TestMetricAttributes(t *testing.T) {
	reader, mp := newReader(t)
	srv := redistest.Own(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	b := bucket.NewFixedWindow(rdb, bucket.PerSecond(5), bucket.WithMeterProvider(mp),
		bucket.WithMetricAttributes(attribute.String("upstream", "openai")))
	ctx := context.Background()
	for range 6 {
		_, err := b.Reserve(ctx, "k", bucket.N(1), 0)
		require.NoError(t, err)
	}
	got := points(t, reader)
	var names []string
	for name := range got {
		assert.Contains(t, name, "upstream=openai", name)
		names = append(names, name)
	}
	sort.Strings(names)
	t.Log(names)
	assert.Equal(t, 5.0, got["sluice.bucket.decisions{decision=now,served_by=redis,upstream=openai}"])
	assert.Equal(t, 1.0, got["sluice.bucket.decisions{decision=refused,served_by=redis,upstream=openai}"])
	assert.Equal(t, 0.0, got["sluice.bucket.tokens.remaining{dimension=requests,upstream=openai}"])
	assert.NotContains(t, got, "sluice.bucket.rate.fraction{dimension=requests,upstream=openai}", "a window does not adapt")
}

// TestMetricsOutage: calls served by the share, Redis's state and the
// transitions, across a real redis-server stopped and started again.
func TestMetricsOutage(t *testing.T) {
	reader, mp := newReader(t)
	srv := redistest.Own(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	b := bucket.NewRedis(rdb, bucket.PerSecond(100), bucket.WithMeterProvider(mp),
		bucket.WithRedisTimeout(100*time.Millisecond))
	ctx := context.Background()
	_, err := b.Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	assert.Equal(t, 0.0, points(t, reader)["sluice.bucket.redis.state{}"])

	srv.Stop()
	for range 5 {
		_, err := b.Reserve(ctx, "k", bucket.N(1), time.Minute) // a share starts empty
		require.NoError(t, err)
	}
	got := points(t, reader)
	assert.Equal(t, 1.0, got["sluice.bucket.redis.state{}"], "failing open")
	assert.Equal(t, 1.0, got["sluice.bucket.redis.transitions{state=fail_open}"])
	assert.Equal(t, 5.0, got["sluice.bucket.decisions{decision=now,served_by=share}"]+got["sluice.bucket.decisions{decision=delayed,served_by=share}"])
	assert.NotContains(t, got, "sluice.bucket.tokens.remaining{dimension=requests}", "no read of a Redis that is down")

	require.NoError(t, srv.Restart())
	require.Eventually(t, func() bool {
		_, err := b.Reserve(ctx, "k", bucket.N(1), 0)
		return err == nil && points(t, reader)["sluice.bucket.redis.transitions{state=serving}"] == 1
	}, 10*time.Second, 50*time.Millisecond)
	got = points(t, reader)
	assert.Equal(t, 0.0, got["sluice.bucket.redis.state{}"])
	assert.Contains(t, got, "sluice.bucket.tokens.remaining{dimension=requests}")
}

// A bucket without a meter provider allocates nothing for metrics, and one
// with allocates nothing per call either.
func TestNoMetricsNoAllocations(t *testing.T) {
	b := bucket.NewLocal(bucket.PerSecond(1e9))
	ctx := context.Background()
	cost := bucket.N(1)
	allocs := testing.AllocsPerRun(1000, func() { _, _ = b.Reserve(ctx, "k", cost, 0) })
	assert.Zero(t, allocs)

	// Nor with one, for a key seen before: the options are precomputed.
	_, mp := newReader(t)
	b = bucket.NewLocal(bucket.PerSecond(1e9), bucket.WithMeterProvider(mp))
	allocs = testing.AllocsPerRun(1000, func() { _, _ = b.Reserve(ctx, "k", cost, 0) })
	assert.Zero(t, allocs, "with metrics")
}

// TestMetricsWaitersEndEarly: a WaitMax whose slot moves up, or whose wait
// is cancelled, leaves the waiters gauge when it ends, not at the slot it
// first had (the gauge counted both until then).
func TestMetricsWaitersEndEarly(t *testing.T) {
	for name, newBucket := range map[string]func(mp *sdkmetric.MeterProvider) bucket.Bucket{
		"local": func(mp *sdkmetric.MeterProvider) bucket.Bucket {
			return bucket.NewLocal(bucket.PerSecond(10), bucket.WithMeterProvider(mp))
		},
		"redis": func(mp *sdkmetric.MeterProvider) bucket.Bucket {
			return bucket.NewRedis(redistest.Client(t), bucket.PerSecond(10), bucket.WithFailClosed(), bucket.WithMeterProvider(mp))
		},
	} {
		t.Run(name, func(t *testing.T) {
			reader, mp := newReader(t)
			b := newBucket(mp)
			ctx := context.Background()
			key := fmt.Sprintf("waiters-%s-%d", name, time.Now().UnixNano())
			_, err := b.Reserve(ctx, key, bucket.N(10), 0) // empty
			require.NoError(t, err)
			cctx, cancel := context.WithCancel(ctx)
			ended := make(chan struct{}, 2)
			for _, c := range []context.Context{ctx, cctx} { // slots at 1 s and 2 s
				go func() {
					_, _ = bucket.WaitMax(c, b, key, bucket.N(10), time.Minute)
					ended <- struct{}{}
				}()
				time.Sleep(20 * time.Millisecond)
			}
			assert.Equal(t, 2.0, points(t, reader)["sluice.bucket.waiters{}"])
			cancel()
			<-ended
			assert.Equal(t, 1.0, points(t, reader)["sluice.bucket.waiters{}"], "the cancelled wait")
			require.NoError(t, b.Adjust(ctx, key, bucket.N(-10))) // the first wait's slot comes now
			<-ended
			assert.Equal(t, 0.0, points(t, reader)["sluice.bucket.waiters{}"], "the wait moved up")
		})
	}
}
