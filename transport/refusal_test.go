package transport_test

import (
	"bytes"
	"compress/gzip"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
)

// TestRefusalsRetriedThroughBucket: with a bucket, a request refused for
// rate (429) or for load with a delay asked (503 with Retry-After) is
// retried until it is accepted, not counted against MaxAttempts; at most
// MaxRefusals times, so that an upstream that refuses everything with
// Retry-After: 0 gets MaxRefusals+1 attempts of it and no more. Other
// failures keep MaxAttempts, refusals between them aside; a spent quota
// is never retried; MaxAttempts 1 disables every retry; and without a
// bucket a refusal counts as an attempt, as before.
func TestRefusalsRetriedThroughBucket(t *testing.T) {
	times := func(n int, s step) []step {
		out := make([]step, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	quota := step{status: 429, header: map[string]string{"X-Should-Retry": "true"},
		body: `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`}
	refusal := status(429, "Retry-After", "0")
	tests := []struct {
		name     string
		steps    []step
		retry    transport.Retry
		noBucket bool
		attempts int
		status   int
	}{
		{"six 429s", times(6, refusal), transport.Retry{}, false, 7, 200},
		{"six 429s without Retry-After", times(6, status(429)), transport.Retry{}, false, 7, 200},
		{"six 503s with Retry-After", times(6, status(503, "Retry-After", "1")), transport.Retry{}, false, 7, 200},
		{"six 503s without Retry-After", times(6, status(503)), transport.Retry{}, false, 3, 503},
		{"429s for ever", times(100, refusal), transport.Retry{}, false, 21, 429},
		{"429s for ever, MaxRefusals 5", times(100, refusal), transport.Retry{MaxRefusals: 5}, false, 6, 429},
		{"500s between 429s", []step{status(500), refusal, status(500), refusal, status(500), refusal}, transport.Retry{}, false, 5, 500},
		{"insufficient_quota, x-should-retry true", []step{quota}, transport.Retry{}, false, 1, 429},
		{"Gemini daily quota", []step{{status: 429, body: geminiPerDay}}, transport.Retry{}, false, 1, 429},
		{"retries disabled", times(6, refusal), transport.Retry{MaxAttempts: 1}, false, 1, 429},
		{"six 429s without a bucket", times(6, refusal), transport.Retry{}, true, 3, 429},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(tt.steps...)
			defer s.Close()
			opts := []transport.Option{transport.WithRetry(tt.retry)}
			if !tt.noBucket {
				opts = append(opts, transport.WithBucket(bucket.NewLocal(bucket.PerSecond(1000))))
			}
			resp, _ := do(t, s, "GET", nil, opts...)
			assert.Equal(t, tt.status, resp.StatusCode)
			assert.EqualValues(t, tt.attempts, s.hits.Load(), "attempts")
		})
	}
}

// TestRefusalRetriesLogged: the debug log says how many attempts a request
// made, how many were refusals retried, and how long it waited in all.
func TestRefusalRetriesLogged(t *testing.T) {
	s := newScript(status(429, "Retry-After", "2"), status(429, "Retry-After", "1"), status(429, "Retry-After", "1"), status(429, "Retry-After", "1"))
	defer s.Close()
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	resp, clk := do(t, s, "GET", nil, transport.WithBucket(bucket.NewLocal(bucket.PerSecond(1000))),
		transport.WithLogger(logger), transport.WithRetry(transport.Retry{Jitter: -1}))
	assert.Equal(t, 200, resp.StatusCode)
	var total time.Duration
	for _, d := range clk.Sleeps() {
		total += d
	}
	assert.Equal(t, 5*time.Second, total, "the delays asked")
	var done string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "sluice: request done") {
			done = line
		}
	}
	assert.Contains(t, done, "attempts=5")
	assert.Contains(t, done, "refusals=4")
	assert.Contains(t, done, "waited=5s")
}

// TestRefusalsWaitedOutWithinMaxWait: the retries of refusals are bounded
// by WithMaxWait in all, not per attempt only: an upstream that refuses
// everything with retry-after-ms 300 gets one attempt under a max wait of
// 50 ms (it got MaxRefusals+1 = 21, 6.6 s, before), and four under 1 s
// (0, 300, 600 and 900 ms waited before each).
func TestRefusalsWaitedOutWithinMaxWait(t *testing.T) {
	refusal := status(429, "Retry-After-Ms", "300")
	forever := make([]step, 100)
	for i := range forever {
		forever[i] = refusal
	}
	for _, tt := range []struct {
		maxWait  time.Duration
		attempts int
	}{{50 * time.Millisecond, 1}, {time.Second, 4}} {
		t.Run(tt.maxWait.String(), func(t *testing.T) {
			s := newScript(forever...)
			defer s.Close()
			resp, _ := do(t, s, "GET", nil, transport.WithBucket(bucket.NewLocal(bucket.PerSecond(1000))),
				transport.WithMaxWait(tt.maxWait), transport.WithRetry(transport.Retry{Jitter: -1}))
			assert.Equal(t, 429, resp.StatusCode)
			assert.EqualValues(t, tt.attempts, s.hits.Load(), "attempts")
		})
	}
}

// TestUnreadRefusalCountsAsAnAttempt: a 429 whose body cannot be read
// (gzip, for a caller that asked for it with its own Accept-Encoding) and
// that names no delay nor quota may be a spent quota: it is retried as any
// failure, MaxAttempts (3) times, not MaxRefusals (it got 21 attempts
// before). The same body uncompressed is read as the spent quota it is:
// one attempt.
func TestUnreadRefusalCountsAsAnAttempt(t *testing.T) {
	const quota = `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, err := w.Write([]byte(quota))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	for _, tt := range []struct {
		name     string
		step     step
		attempts int
	}{
		{"gzip", step{status: 429, header: map[string]string{"Content-Encoding": "gzip"}, body: gz.String()}, 3},
		{"plain", step{status: 429, body: quota}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			steps := make([]step, 30)
			for i := range steps {
				steps[i] = tt.step
			}
			s := newScript(steps...)
			defer s.Close()
			resp, _ := do(t, s, "GET", map[string]string{"Accept-Encoding": "gzip"},
				transport.WithBucket(bucket.NewLocal(bucket.PerSecond(1000))))
			assert.Equal(t, 429, resp.StatusCode)
			assert.EqualValues(t, tt.attempts, s.hits.Load(), "attempts")
		})
	}
}
