package transport_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/transport"
	"github.com/sony/gobreaker/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// collect is metrictest.Points.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]float64 {
	return metrictest.Points(t, r)
}

func TestMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	s := newScript(status(503), status(429, "Retry-After", "1"), status(500), status(500))
	defer s.Close()
	clk := newFakeClock()
	b := bucket.NewLocal(bucket.PerSecond(2), bucket.WithClock(frozen{}))
	tr := transport.New(nil, transport.WithMeterProvider(mp), transport.WithTestClock(clk.Now, clk.Sleep),
		transport.WithBucket(b), transport.WithMaxWait(time.Millisecond),
		transport.WithBreaker(gobreaker.Settings{Name: "api", ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 2 }}))

	assert.Equal(t, map[string]float64{"sluice.transport.breaker.state{breaker=api}": 0}, collect(t, reader))

	// 503 → retry → 429, whose Retry-After of 1s would take the request
	// past its max wait of 1ms in all: the 429 is returned, not retried.
	resp, err := get(t, tr, context.Background(), s.URL)
	require.NoError(t, err)
	assert.Equal(t, 429, resp.StatusCode)
	assert.Equal(t, map[string]float64{
		"sluice.transport.breaker.state{breaker=api}":     0,
		"sluice.transport.attempts{outcome=server_error}": 1,
		"sluice.transport.attempts{outcome=throttled}":    1,
		"sluice.transport.retries{reason=503}":            1,
		"sluice.transport.wait.duration{}":                2,
		"sluice.transport.request.attempts{}":             1,
		"sluice.transport.request.wait.duration{}":        1,
	}, collect(t, reader))
	sums := map[string]float64{}
	for _, p := range metrictest.Collect(t, reader) {
		sums[p.Name()] = p.Sum
	}
	assert.Equal(t, 2.0, sums["sluice.transport.request.attempts{}"], "attempts sent by the request")
	// The delay before the 503's retry: a backoff of 500ms, jitter up to
	// 20%.
	assert.InDelta(t, 0.5+0.05, sums["sluice.transport.request.wait.duration{}"], 0.05+1e-9, "seconds waited by the request")

	// Two 500s trip the breaker; the next call is refused.
	b2 := bucket.NewLocal(bucket.PerSecond(100))
	tr = transport.New(nil, transport.WithMeterProvider(mp), transport.WithBucket(b2), transport.WithTestClock(clk.Now, clk.Sleep),
		transport.WithRetry(transport.Retry{MaxAttempts: 1}),
		transport.WithBreaker(gobreaker.Settings{Name: "api2", ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 2 }}))
	for range 2 {
		resp, err := get(t, tr, context.Background(), s.URL) // 500, 500
		require.NoError(t, err)
		assert.Equal(t, 500, resp.StatusCode)
	}
	_, err = get(t, tr, context.Background(), s.URL)
	assert.ErrorIs(t, err, transport.ErrCircuitOpen)
	got := collect(t, reader)
	assert.Equal(t, 2.0, got["sluice.transport.breaker.state{breaker=api2}"])
	assert.Equal(t, 1.0, got["sluice.transport.attempts{outcome=breaker_open}"])
	assert.Equal(t, 3.0, got["sluice.transport.attempts{outcome=server_error}"])
	assert.Equal(t, 4.0, got["sluice.transport.wait.duration{}"])
	assert.Contains(t, got, "sluice.transport.breaker.state{breaker=api}")
}

// TestMetricAttributes: the static attributes are on every measurement,
// the Transport's and its bucket's, so that two upstreams can be told
// apart.
func TestMetricAttributes(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	s := newScript(status(429, "Retry-After", "0"), status(200))
	defer s.Close()
	up := attribute.String("upstream", "anthropic")
	b := bucket.NewLocal(bucket.PerSecond(100), bucket.WithMeterProvider(mp), bucket.WithMetricAttributes(up))
	tr := transport.New(nil, transport.WithMeterProvider(mp), transport.WithBucket(b),
		transport.WithMetricAttributes(up), transport.WithBreaker(gobreaker.Settings{Name: "api"}))
	resp, err := get(t, tr, context.Background(), s.URL)
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	n := 0
	for _, p := range metrictest.Collect(t, reader) {
		v, ok := p.Attrs.Value("upstream")
		assert.True(t, ok && v.AsString() == "anthropic", p.Name())
		n++
	}
	assert.GreaterOrEqual(t, n, 10, "points of the transport and the bucket")
}

// TestSecretsNeverLeak sends requests carrying credentials through every
// path that logs, fails or records a metric, and looks for them.
func TestSecretsNeverLeak(t *testing.T) {
	secrets := []string{"sk-bearer-secret", "x-api-secret", "query-secret", "user-secret"}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	s := newScript(status(503, "Retry-After-Ms", "1"), status(429, "Retry-After", "120"), status(500), status(500))
	defer s.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := "http://" + l.Addr().String()
	l.Close()

	tr := transport.New(nil, transport.WithLogger(logger), transport.WithMeterProvider(mp),
		transport.WithKey(transport.CredentialKey),
		transport.WithBucket(bucket.NewLocal(bucket.PerSecond(4), bucket.WithClock(frozen{}))),
		transport.WithRetry(transport.Retry{InitialInterval: time.Millisecond}), transport.WithMaxWait(100*time.Millisecond),
		transport.WithBreaker(gobreaker.Settings{ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 3 }}))
	var errs []string
	send := func(base string) {
		u := strings.Replace(base, "http://", "http://user:user-secret@", 1) + "/v1?key=query-secret"
		req, _ := http.NewRequest("POST", u, strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer sk-bearer-secret")
		req.Header.Set("X-Api-Key", "x-api-secret")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			errs = append(errs, err.Error())
			return
		}
		resp.Body.Close()
	}
	send(s.URL)   // 503 (breaker failure 1), retried; 429 asking for too long: returned, key paused
	send(s.URL)   // paused past the max wait: wait error
	send(refused) // connection refused (failure 2)
	send(refused) // connection refused (failure 3): the breaker opens
	send(refused) // breaker open
	require.Len(t, errs, 4)
	require.Contains(t, logs.String(), "sluice: retrying")
	metrics := fmt.Sprint(collect(t, reader))
	for _, sec := range secrets {
		assert.NotContains(t, logs.String(), sec, "logs")
		assert.NotContains(t, metrics, sec, "metrics")
		for _, e := range errs {
			assert.NotContains(t, e, sec, "error")
		}
	}
	t.Log(errs)
}

func TestLogLines(t *testing.T) {
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := newScript(status(503, "Retry-After-Ms", "1"))
	defer s.Close()
	tr := transport.New(nil, transport.WithLogger(logger))
	_, err := get(t, tr, context.Background(), s.URL+"/v1/chat?x=1")
	require.NoError(t, err)
	t.Log("\n" + logs.String())
	assert.Contains(t, logs.String(), "sluice: retrying")
	assert.NotContains(t, logs.String(), "x=1")
}
