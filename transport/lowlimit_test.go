package transport_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/transport"
)

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// anthropicLimited is a fake provider that reports on every response a
// limit of limit requests a minute, as Anthropic does, with one spent.
func anthropicLimited(t *testing.T, limit int) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("anthropic-ratelimit-requests-limit", strconv.Itoa(limit))
		w.Header().Set("anthropic-ratelimit-requests-remaining", strconv.Itoa(limit-1))
		w.Header().Set("anthropic-ratelimit-requests-reset", time.Now().Add(time.Minute/time.Duration(limit)).UTC().Format(time.RFC3339))
		_, _ = io.WriteString(w, `{}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// call makes one call through tr to url, and closes its response.
func call(t *testing.T, tr http.RoundTripper, url string) {
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
}

// TestLowLimitWarned: a provider whose headers hold a key at a tenth of its
// configured limit (10 requests a minute reported, 100 configured) is
// reported by one warn line in the first minute, with both figures and the
// header, and counted; the next minute again, once; a provider whose
// report matches the configuration, never. Before, nothing was logged
// above debug level, and a run took ten times as long as configured
// without a word.
func TestLowLimitWarned(t *testing.T) {
	const warning = "level=WARN msg=\"sluice: a key is held below half its configured limit"
	for _, reported := range []int{10, 100} {
		t.Run("Local/reported "+strconv.Itoa(reported), func(t *testing.T) {
			var logs lockedBuffer
			clk := newFakeClock()
			reader := sdkmetric.NewManualReader()
			b := bucket.NewLocal(bucket.PerMinute(100), bucket.WithClock(clk),
				bucket.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
				bucket.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
			srv := anthropicLimited(t, reported)
			tr := transport.New(nil, transport.WithBucket(b))
			for range 5 {
				call(t, tr, srv.URL)
			}
			out := logs.String()
			points := metrictest.Points(t, reader)
			low := `sluice.bucket.limit.low{dimension=requests}`
			if reported == 100 {
				assert.Zero(t, strings.Count(out, warning), out)
				assert.Zero(t, points[low])
				return
			}
			assert.Equal(t, 1, strings.Count(out, warning), "5 calls in the first minute: %s", out)
			assert.Contains(t, out, `configured="100/min burst 100"`)
			assert.Contains(t, out, `effective="10/min burst 10"`)
			assert.Contains(t, out, `by=Anthropic-Ratelimit-Requests-Limit`)
			assert.Contains(t, out, "key="+srv.URL)
			assert.Equal(t, 1.0, points[low], "%v", points)

			require.NoError(t, clk.Sleep(t.Context(), 61*time.Second))
			time.Sleep(100 * time.Millisecond) // the Transport passes a key's reports on every 50 ms of its own clock
			call(t, tr, srv.URL)
			assert.Equal(t, 2, strings.Count(logs.String(), warning), "a minute later, once more: %s", logs.String())
		})
	}
	t.Run("Redis/reported 10", func(t *testing.T) {
		var logs lockedBuffer
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), ContextTimeoutEnabled: true})
		t.Cleanup(func() { rdb.Close() })
		b := bucket.NewRedis(rdb, bucket.PerMinute(100), bucket.WithPrefix("low"+strconv.FormatInt(time.Now().UnixNano(), 36)),
			bucket.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		srv := anthropicLimited(t, 10)
		tr := transport.New(nil, transport.WithBucket(b))
		for range 5 {
			call(t, tr, srv.URL)
		}
		out := logs.String()
		assert.Equal(t, 1, strings.Count(out, warning), out)
		assert.Contains(t, out, `configured="100/min burst 100"`)
		assert.Contains(t, out, `effective="10/min burst 10"`)
	})
}
