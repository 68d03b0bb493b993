package transport_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/transport"
)

// tailMeter is a UsageMeter for tests: the call cost what the body's last
// "usage=N" says, in tokens.
type tailMeter struct {
	seen     bytes.Buffer
	failWith error
}

var usageRe = regexp.MustCompile(`usage=(\d+)$`)

func (m *tailMeter) Write(p []byte) (int, error) {
	if m.failWith != nil {
		return 0, m.failWith
	}
	return m.seen.Write(p)
}

func (m *tailMeter) Cost() (bucket.Cost, bool) {
	s := usageRe.FindStringSubmatch(m.seen.String())
	if s == nil {
		return nil, false
	}
	n, _ := strconv.Atoi(s[1])
	return bucket.Cost{bucket.Tokens: float64(n)}, true
}

// adjustCounter is a bucket that counts the calls to Adjust.
type adjustCounter struct {
	bucket.Bucket
	n atomic.Int32
}

func (b *adjustCounter) Adjust(ctx context.Context, key string, delta bucket.Cost) error {
	b.n.Add(1)
	return b.Bucket.Adjust(ctx, key, delta)
}

// newMetered returns a Transport charging {requests: 1, tokens: 100} to key
// "k" of a frozen bucket of 1000 tokens, metering with tailMeter.
func newMetered(t *testing.T, opts ...transport.Option) (*transport.Transport, *bucket.Local, *adjustCounter) {
	t.Helper()
	b := bucket.NewLocal(bucket.PerSecond(10), bucket.WithLimit(bucket.Tokens, bucket.PerSecond(1000)),
		bucket.WithClock(frozen{}))
	counted := &adjustCounter{Bucket: b}
	clk := newFakeClock()
	opts = append([]transport.Option{
		transport.WithBucket(counted),
		transport.WithTestClock(clk.Now, clk.Sleep),
		transport.WithKey(func(*http.Request) string { return "k" }),
		transport.WithCost(func(*http.Request) bucket.Cost { return bucket.Cost{bucket.Requests: 1, bucket.Tokens: 100} }),
		transport.WithUsage(func(*http.Response) transport.UsageMeter { return &tailMeter{} }),
	}, opts...)
	return transport.New(nil, opts...), b, counted
}

func TestUsageReconciles(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		read   int // bytes read before Close; -1: to EOF
		tokens float64
	}{
		{"refund", "hello usage=30", -1, 1000 - 30},
		{"debit", "hello usage=250", -1, 1000 - 250},
		{"exact", "hello usage=100", -1, 1000 - 100},
		{"closed before the usage: charge kept", "hello usage=30", 5, 1000 - 100},
		{"no usage: charge kept", "hello", -1, 1000 - 100},
		{"closed unread: charge kept", "hello usage=30", 0, 1000 - 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScript(step{status: 200, body: tc.body})
			defer s.Close()
			tr, b, counted := newMetered(t)
			resp, err := get(t, tr, context.Background(), s.URL)
			require.NoError(t, err)
			assert.Equal(t, bucket.Cost{bucket.Requests: 9, bucket.Tokens: 900}, b.Tokens("k"), "charged")

			var got []byte
			if tc.read < 0 {
				got, err = io.ReadAll(resp.Body)
				require.NoError(t, err)
				assert.Equal(t, tc.body, string(got), "the caller reads the bytes sent")
			} else {
				got = make([]byte, tc.read)
				_, err = io.ReadFull(resp.Body, got)
				require.NoError(t, err)
			}
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, bucket.Cost{bucket.Requests: 9, bucket.Tokens: tc.tokens}, b.Tokens("k"))
			assert.LessOrEqual(t, counted.n.Load(), int32(1), "at most one adjustment")
			require.NoError(t, resp.Body.Close(), "a second Close")
			assert.Equal(t, bucket.Cost{bucket.Requests: 9, bucket.Tokens: tc.tokens}, b.Tokens("k"))
		})
	}
}

func TestUsageReconciledAtEOFWithoutClose(t *testing.T) {
	s := newScript(step{status: 200, body: "usage=40"})
	defer s.Close()
	tr, b, _ := newMetered(t)
	resp, err := get(t, tr, context.Background(), s.URL)
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, 1000-40., b.Tokens("k")[bucket.Tokens])
}

func TestUsageAfterRetryChargesTheLastAttempt(t *testing.T) {
	s := newScript(status(503), step{status: 200, body: "usage=10"})
	defer s.Close()
	tr, b, counted := newMetered(t)
	resp, err := get(t, tr, context.Background(), s.URL)
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, bucket.Cost{bucket.Requests: 8, bucket.Tokens: 1000 - 100 - 10}, b.Tokens("k"),
		"the 503 keeps its charge; the 200 is reconciled to its usage")
	assert.EqualValues(t, 1, counted.n.Load())
}

// TestRefusalKeepsOnlyItsRequestCharge: an attempt the provider refused
// for rate or load, a refusal that waiting cures, keeps the request it was
// charged and gives back the rest (its tokens), which the provider did not
// count, whether it is retried or returned; but for a dimension whose
// remaining the refusal reports, to which the bucket has already been
// brought. A spent quota, or a 503 that asks for no delay, keeps its whole
// charge. Before, every attempt kept its whole charge: the refused attempts'
// tokens were counted twice, and 15 refusals in 143 calls (llmtest's
// Anthropic, through sluice proxy) charged 1.12 times the tokens the
// server counted.
func TestRefusalKeepsOnlyItsRequestCharge(t *testing.T) {
	const quota = `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`
	for _, tc := range []struct {
		name   string
		steps  []step
		retry  transport.Retry
		status int
		want   bucket.Cost // left of 10 requests and 1000 tokens
	}{
		{"a 429 retried", []step{status(429, "Retry-After", "0"), {status: 200, body: "usage=10"}}, transport.Retry{}, 200,
			bucket.Cost{bucket.Requests: 8, bucket.Tokens: 1000 - 10}},
		{"a 529 that asks for a delay, retried", []step{status(529, "Retry-After", "0"), {status: 200, body: "usage=10"}}, transport.Retry{}, 200,
			bucket.Cost{bucket.Requests: 8, bucket.Tokens: 1000 - 10}},
		{"a 429 returned, retries off", []step{status(429, "Retry-After", "0")}, transport.Retry{MaxAttempts: 1}, 429,
			bucket.Cost{bucket.Requests: 9, bucket.Tokens: 1000}},
		{"a 429 that reports the tokens remaining", []step{status(429, "Retry-After", "0", "x-ratelimit-limit-tokens", "1000",
			"x-ratelimit-remaining-tokens", "950", "x-ratelimit-reset-tokens", "3s"), {status: 200, body: "usage=10"}}, transport.Retry{}, 200,
			bucket.Cost{bucket.Requests: 8, bucket.Tokens: 1000 - 100 - 10}},
		{"a spent quota", []step{{status: 429, body: quota}}, transport.Retry{}, 429,
			bucket.Cost{bucket.Requests: 9, bucket.Tokens: 1000 - 100}},
		{"a 503 that asks for no delay, retried", []step{status(503), {status: 200, body: "usage=10"}}, transport.Retry{}, 200,
			bucket.Cost{bucket.Requests: 8, bucket.Tokens: 1000 - 100 - 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScript(tc.steps...)
			defer s.Close()
			tr, b, _ := newMetered(t, transport.WithRetry(tc.retry))
			resp, err := get(t, tr, context.Background(), s.URL)
			require.NoError(t, err)
			assert.Equal(t, tc.status, resp.StatusCode)
			_, err = io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, tc.want, b.Tokens("k"))
		})
	}
}

func TestUsageOfThePreviousResponse(t *testing.T) {
	// The retry of the 503 cannot be sent (its wait passes the max wait),
	// so the 503 is returned, and metered.
	s := newScript(step{status: 503, body: "busy usage=0"})
	defer s.Close()
	b := bucket.NewLocal(bucket.PerSecond(1), bucket.WithLimit(bucket.Tokens, bucket.PerSecond(1000)),
		bucket.WithClock(frozen{}))
	clk := newFakeClock()
	tr := transport.New(nil, transport.WithBucket(b), transport.WithTestClock(clk.Now, clk.Sleep),
		transport.WithKey(func(*http.Request) string { return "k" }),
		transport.WithMaxWait(10*time.Millisecond),
		transport.WithCost(func(*http.Request) bucket.Cost { return bucket.Cost{bucket.Requests: 1, bucket.Tokens: 100} }),
		transport.WithUsage(func(*http.Response) transport.UsageMeter { return &tailMeter{} }))
	resp, err := get(t, tr, context.Background(), s.URL)
	require.NoError(t, err)
	assert.Equal(t, 503, resp.StatusCode)
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, bucket.Cost{bucket.Requests: 0, bucket.Tokens: 1000}, b.Tokens("k"))
}

func TestUsageNotMetered(t *testing.T) {
	t.Run("nil meter", func(t *testing.T) {
		s := newScript(step{status: 200, body: "usage=1"})
		defer s.Close()
		tr, b, counted := newMetered(t,
			transport.WithUsage(func(*http.Response) transport.UsageMeter { return nil }))
		resp, err := get(t, tr, context.Background(), s.URL)
		require.NoError(t, err)
		_, err = io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, 900., b.Tokens("k")[bucket.Tokens])
		assert.Zero(t, counted.n.Load())
	})
	t.Run("meter fails", func(t *testing.T) {
		s := newScript(step{status: 200, body: "usage=1"})
		defer s.Close()
		tr, b, counted := newMetered(t, transport.WithUsage(func(*http.Response) transport.UsageMeter {
			return &tailMeter{failWith: errors.New("boom")}
		}))
		resp, err := get(t, tr, context.Background(), s.URL)
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, "usage=1", string(got), "the caller's read is unaffected")
		assert.Equal(t, 900., b.Tokens("k")[bucket.Tokens])
		assert.Zero(t, counted.n.Load())
	})
	t.Run("no bucket", func(t *testing.T) {
		s := newScript(step{status: 200, body: "usage=1"})
		defer s.Close()
		called := false
		tr := transport.New(nil, transport.WithUsage(func(*http.Response) transport.UsageMeter {
			called = true
			return &tailMeter{}
		}))
		resp, err := get(t, tr, context.Background(), s.URL)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		assert.False(t, called)
	})
}

func TestUsageCloseDuringRead(t *testing.T) {
	// A body closed while another goroutine reads it: under -race, Read and
	// Close share the meter safely, and the charge is reconciled once, to
	// the usage if the meter got it before Close, or not at all.
	pr, pw := io.Pipe()
	b := bucket.NewLocal(bucket.PerSecond(10), bucket.WithLimit(bucket.Tokens, bucket.PerSecond(1000)),
		bucket.WithClock(frozen{}))
	counted := &adjustCounter{Bucket: b}
	tr := transport.New(roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: pr, Header: http.Header{}, Request: r}, nil
	}), transport.WithBucket(counted), transport.WithKey(func(*http.Request) string { return "k" }),
		transport.WithCost(func(*http.Request) bucket.Cost { return bucket.Cost{bucket.Tokens: 100} }),
		transport.WithUsage(func(*http.Response) transport.UsageMeter { return &tailMeter{} }))
	resp, err := get(t, tr, context.Background(), "http://example.invalid/")
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() { io.Copy(io.Discard, resp.Body) })
	io.WriteString(pw, "usage=5") // returns once read
	resp.Body.Close()
	pw.CloseWithError(errors.New("closed"))
	wg.Wait()
	assert.Contains(t, []float64{900, 995}, b.Tokens("k")[bucket.Tokens])
	assert.LessOrEqual(t, counted.n.Load(), int32(1))
}

func TestUsageLogsNoSecret(t *testing.T) {
	s := newScript(step{status: 200, body: "usage=30"})
	defer s.Close()
	var logs strings.Builder
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	tr, _, _ := newMetered(t, transport.WithLogger(logger))
	req, err := http.NewRequest("GET", s.URL, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk-secret")
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Contains(t, logs.String(), `msg="sluice: usage reconciled" delta.tokens=-70`)
	assert.NotContains(t, logs.String(), "sk-secret")
}

// costMeter is a UsageMeter that reports cost, whatever the body.
type costMeter struct{ cost bucket.Cost }

func (m costMeter) Write(p []byte) (int, error) { return len(p), nil }
func (m costMeter) Cost() (bucket.Cost, bool)   { return m.cost, true }

// TestUsageFromALyingUpstream: a usage report is outside input. A total of
// 1e15 or 1e300 tokens became a debit as large, and -5 a refund of more
// than the charge; NaN and infinities reached the bucket. An amount that
// is not a number, infinite or negative is no report (the charge stands),
// and so is one above 1e9, beyond any bucket's burst.
func TestUsageFromALyingUpstream(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for _, tc := range []struct {
		name             string
		usage            bucket.Cost
		requests, tokens float64 // left in the bucket
	}{
		{"honest", bucket.Cost{bucket.Tokens: 30}, 9, 1000 - 30},
		{"1e15", bucket.Cost{bucket.Tokens: 1e15}, 9, 900},
		{"1e300", bucket.Cost{bucket.Tokens: 1e300}, 9, 900},
		{"1e9: the bucket debits a burst at most", bucket.Cost{bucket.Tokens: 1e9}, 9, -100},
		{"negative", bucket.Cost{bucket.Tokens: -5}, 9, 900},
		{"NaN", bucket.Cost{bucket.Tokens: nan}, 9, 900},
		{"+Inf", bucket.Cost{bucket.Tokens: inf}, 9, 900},
		{"-Inf", bucket.Cost{bucket.Tokens: -inf}, 9, 900},
		{"one dimension lies", bucket.Cost{bucket.Requests: -5, bucket.Tokens: 30}, 9, 1000 - 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScript(step{status: 200, body: "hello"})
			defer s.Close()
			tr, b, _ := newMetered(t, transport.WithUsage(func(*http.Response) transport.UsageMeter {
				return costMeter{tc.usage}
			}))
			resp, err := get(t, tr, context.Background(), s.URL)
			require.NoError(t, err)
			_, err = io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, bucket.Cost{bucket.Requests: tc.requests, bucket.Tokens: tc.tokens}, b.Tokens("k"))
		})
	}
}

// TestStreamErrorIsObserved: an error event in a stream that began with 200
// (Anthropic's overloaded_error, a rate limit that ends the stream) is told
// to the bucket once the caller has read the body, with the attempt's
// epoch; a rate limit's delay pauses the key. Before, the bucket never
// heard of it: the fleet kept sending into an overloaded provider.
func TestStreamErrorIsObserved(t *testing.T) {
	for _, c := range []struct {
		name, event string
		class       adaptive.Class
		pause       time.Duration
	}{
		{"overloaded", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, adaptive.Overloaded, 0},
		{"rate limit", `{"type":"error","error":{"type":"rate_limit_error","message":"Please try again in 2s."}}`, adaptive.RateLimited, 2 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n")
				io.WriteString(w, "event: error\ndata: "+c.event+"\n\n")
			}))
			t.Cleanup(srv.Close)
			b := &observing{Bucket: bucket.NewLocal(bucket.PerSecond(100), bucket.WithLimit(bucket.Tokens, bucket.PerSecond(1e4)))}
			tr := transport.New(nil, transport.WithBucket(b), transport.WithUsage(llmclient.MeterUsage))
			resp, err := tr.RoundTrip(must(http.NewRequest("GET", srv.URL, nil)))
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			b.mu.Lock()
			before := len(b.fbs)
			b.mu.Unlock()
			_, err = io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			b.mu.Lock()
			defer b.mu.Unlock()
			require.Len(t, b.fbs, before+1, "the stream's error, observed once")
			fb := b.fbs[len(b.fbs)-1]
			assert.Equal(t, c.class, fb.Class)
			assert.Equal(t, c.pause, fb.RetryAfter)
		})
	}
}

// TestStats: a Transport's ledger shows what its calls were charged, what
// was refunded (an estimate above the usage) and debited (a usage above
// the estimate), and agrees with the bucket: a user had to copy a 23-line
// ledger out of an example to see it.
func TestStats(t *testing.T) {
	usage := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"usage":{"total_tokens":%d}}`, usage)
	}))
	t.Cleanup(srv.Close)
	b := bucket.NewLocal(bucket.PerSecond(100), bucket.WithLimit(bucket.Tokens, bucket.PerSecond(1e4)),
		bucket.WithClock(frozen{}))
	tr := transport.New(nil, transport.WithBucket(b), transport.WithUsage(llmclient.MeterUsage),
		transport.WithCost(func(*http.Request) bucket.Cost { return bucket.Cost{bucket.Requests: 1, bucket.Tokens: 100} }))
	for _, u := range []int{40, 250} {
		usage = u
		resp, err := tr.RoundTrip(must(http.NewRequest("GET", srv.URL, nil)))
		require.NoError(t, err)
		_, err = io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
	}
	st := tr.Stats()
	assert.Equal(t, bucket.Cost{bucket.Requests: 2, bucket.Tokens: 200}, st.Charged)
	assert.Equal(t, bucket.Cost{bucket.Tokens: 60}, st.Refunded)
	assert.Equal(t, bucket.Cost{bucket.Tokens: 150}, st.Debited)
	key := transport.HostKey(must(http.NewRequest("GET", srv.URL, nil)))
	assert.InDelta(t, 1e4-(200-60+150), b.Tokens(key)[bucket.Tokens], 1e-9, "the bucket holds Charged − Refunded + Debited")
	st.Charged[bucket.Tokens] = 0
	assert.Equal(t, 200.0, tr.Stats().Charged[bucket.Tokens], "a copy")
}

// TestStatsCountsWhatItSays: Sent is the attempts the server saw, a 429
// and its retry both; Debited and Refunded count only the dimensions the
// call's cost charged; Refunded counts the tokens the 429 gave back
// (TestRefusalKeepsOnlyItsRequestCharge). Before, an Anthropic usage's total tokens, which its
// cost does not charge and its bucket does not limit, showed in Debited as
// if taken (the 16 tokens of a call charged input and output apiece), and
// nothing said how many attempts were sent.
func TestStatsCountsWhatItSays(t *testing.T) {
	var seen atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"usage":{"input_tokens":6,"output_tokens":10}}`)
	}))
	t.Cleanup(srv.Close)
	b := bucket.NewLocal(bucket.PerSecond(100), bucket.WithLimit(bucket.InputTokens, bucket.PerSecond(1e4)),
		bucket.WithLimit(bucket.OutputTokens, bucket.PerSecond(1e4)), bucket.WithClock(frozen{}))
	tr := transport.New(nil, transport.WithBucket(b), transport.WithUsage(llmclient.MeterUsage),
		transport.WithCost(func(*http.Request) bucket.Cost {
			return bucket.Cost{bucket.Requests: 1, bucket.InputTokens: 8, bucket.OutputTokens: 20}
		}))
	resp, err := tr.RoundTrip(must(http.NewRequest("GET", srv.URL, nil)))
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	st := tr.Stats()
	assert.Equal(t, seen.Load(), st.Sent, "the attempts the server saw")
	assert.EqualValues(t, 2, st.Sent)
	assert.Equal(t, bucket.Cost{bucket.Requests: 2, bucket.InputTokens: 16, bucket.OutputTokens: 40}, st.Charged)
	assert.Equal(t, bucket.Cost{bucket.InputTokens: 8 + 2, bucket.OutputTokens: 20 + 10}, st.Refunded,
		"the 429's tokens, and what the 200 did not use")
	assert.Empty(t, st.Debited, "the usage's total tokens were never charged")
}
