package transport_test

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
)

// noLeaks checks, once t and its cleanups are done, that no goroutine
// started since is left.
func noLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// respond returns a base RoundTripper that answers with the responses
// made by steps in order, then 200, and counts the requests.
func respond(hits *atomic.Int32, steps ...func() *http.Response) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		n := int(hits.Add(1))
		if r.Body != nil {
			r.Body.Close()
		}
		if n <= len(steps) {
			return steps[n-1](), nil
		}
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok"))}, nil
	})
}

func withHeader(code int, kv ...string) func() *http.Response {
	return func() *http.Response {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(strings.NewReader(`{"error":{}}`))}
	}
}

// TestMalformedRateLimitHeaders: a 429 whose Retry-After and rate-limit
// headers make no sense is retried after the computed backoff, as if they
// were absent: the key is paused only as any 429 that asks for no wait
// pauses it, one window of its limit (10 ms here), and the bucket's rate
// stays a finite, positive number.
func TestMalformedRateLimitHeaders(t *testing.T) {
	noLeaks(t)
	for _, hdr := range [][]string{
		{"Retry-After", "soon"}, {"Retry-After", "-5"}, {"Retry-After", "NaN"}, {"Retry-After", "+Inf"},
		{"Retry-After", "-Inf"}, {"Retry-After", "0x10"}, {"Retry-After", " "}, {"Retry-After", "1e400"},
		{"Retry-After", "Wed, 32 Foo 2026 25:61:61 GMT"}, {"Retry-After", "5, 6"},
		{"Retry-After-Ms", "-1"}, {"Retry-After-Ms", "NaN"}, {"Retry-After-Ms", "1e309"}, {"Retry-After-Ms", "x"},
		{"X-Ratelimit-Remaining-Requests", "abc"}, {"X-Ratelimit-Remaining-Requests", "-1"},
		{"X-Ratelimit-Remaining-Requests", "NaN"}, {"X-Ratelimit-Limit-Requests", "0"},
		{"X-Ratelimit-Limit-Requests", "-5"}, {"X-Ratelimit-Limit-Requests", "Inf"},
		{"X-Ratelimit-Limit-Tokens", "1e400"}, {"X-Ratelimit-Reset-Requests", "garbage"},
		{"X-Ratelimit-Reset-Requests", "-1s"}, {"X-Ratelimit-Reset-Tokens", "99999999999h"},
		{"Anthropic-Ratelimit-Requests-Remaining", "x"}, {"Anthropic-Ratelimit-Requests-Reset", "yesterday"},
		{"Anthropic-Ratelimit-Tokens-Limit", "-1"},
		{"RateLimit", "garbage;;;="}, {"RateLimit", `"default";r=-1;t=NaN`},
		{"RateLimit-Policy", `"x";q=abc;w=-1`}, {"RateLimit-Policy", `;;;`},
		{"X-Ratelimit-Remaining", "abc"}, {"X-Ratelimit-Remaining", "-1"}, {"X-Ratelimit-Limit", "Inf"},
		{"X-Ratelimit-Reset", "99999999999999999999"}, {"X-Ratelimit-Reset", "-5"},
		{"X-Ratelimit-Reset-After", "NaN"}, {"X-Ratelimit-Reset-After", "1e9"},
	} {
		t.Run(hdr[0]+": "+hdr[1], func(t *testing.T) {
			var hits atomic.Int32
			clk := newFakeClock()
			// Windows of 10 ms: the pause of a 429 that asks for no wait.
			b := bucket.NewLocal(bucket.Limit{Rate: 100, Burst: 1}, bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 1000, Burst: 10}),
				bucket.WithClock(frozen{}))
			tr := transport.New(respond(&hits, withHeader(429, hdr...)), transport.WithBucket(b),
				transport.WithTestClock(clk.Now, clk.Sleep), transport.WithTestRand(func() float64 { return 0 }))
			began := time.Now()
			resp, err := get(t, tr, context.Background(), "https://api.example.com/v1")
			require.NoError(t, err)
			assert.Equal(t, 200, resp.StatusCode)
			assert.EqualValues(t, 2, hits.Load())
			assert.Equal(t, []time.Duration{500 * time.Millisecond}, clk.Sleeps(), "the first backoff, no pause of the transport's")
			// The bucket's wait is in real time: its pause, 10 ms, not a
			// delay read from the headers (the longest would be the
			// horizon, 120 windows: 1.2 s).
			assert.Less(t, time.Since(began), 600*time.Millisecond)
			for dim, r := range b.Rate("https://api.example.com") {
				assert.False(t, math.IsNaN(r) || math.IsInf(r, 0) || r <= 0, "%s rate %v", dim, r)
			}
		})
	}
}

// TestRetryAfterHuge: a Retry-After of 999999999 s is not waited for: the
// 429 is returned at once, and the key is held back for MaxRetryAfter only,
// so a request with a deadline fails at once with bucket.ErrDeadline.
func TestRetryAfterHuge(t *testing.T) {
	noLeaks(t)
	var hits atomic.Int32
	clk := newFakeClock()
	tr := transport.New(respond(&hits, withHeader(429, "Retry-After", "999999999")),
		transport.WithBucket(bucket.NewLocal(bucket.PerSecond(100))), transport.WithTestClock(clk.Now, clk.Sleep))
	resp, err := get(t, tr, context.Background(), "https://api.example.com/v1")
	require.NoError(t, err)
	assert.Equal(t, 429, resp.StatusCode)
	assert.EqualValues(t, 1, hits.Load())
	assert.Empty(t, clk.Sleeps())

	ctx, cancel := context.WithDeadline(context.Background(), clk.Now().Add(time.Second))
	defer cancel()
	_, err = get(t, tr, ctx, "https://api.example.com/v1")
	var we *bucket.WaitError
	require.ErrorAs(t, err, &we)
	assert.ErrorIs(t, err, bucket.ErrDeadline)
	assert.Equal(t, 60*time.Second, we.RetryAfter, "held back for MaxRetryAfter, not 31 years")
	assert.EqualValues(t, 1, hits.Load(), "nothing sent")
	assert.Empty(t, clk.Sleeps())
}

// TestBaseBreaksContract: a base RoundTripper that returns neither a
// response nor an error, or both, or a response without a body, gets an
// error or a usable response, never a panic; every body it returned is
// closed.
func TestBaseBreaksContract(t *testing.T) {
	noLeaks(t)
	clk := newFakeClock()
	opts := []transport.Option{transport.WithTestClock(clk.Now, clk.Sleep), transport.WithBucket(bucket.NewLocal(bucket.PerSecond(100)))}

	var hits atomic.Int32
	nilNil := transport.New(roundTripperFunc(func(*http.Request) (*http.Response, error) {
		hits.Add(1)
		return nil, nil
	}), opts...)
	resp, err := get(t, nilNil, context.Background(), "https://api.example.com/v1")
	assert.Nil(t, resp)
	assert.ErrorContains(t, err, "transport: base RoundTripper returned no response and no error")
	assert.EqualValues(t, 3, hits.Load(), "an idempotent request, retried like a connection error")
	_, err = (&http.Client{Transport: nilNil}).Get("https://api.example.com/v1")
	assert.ErrorContains(t, err, "no response and no error", "through an http.Client too")

	body := &closeTracker{Reader: strings.NewReader("ignored")}
	both := transport.New(roundTripperFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: body}, errors.New("base: broken")
	}), append(opts, transport.WithRetry(transport.Retry{MaxAttempts: 1}))...)
	resp, err = get(t, both, context.Background(), "https://api.example.com/v1")
	assert.Nil(t, resp)
	assert.ErrorContains(t, err, "base: broken")
	assert.True(t, body.closed.Load(), "the response that came with the error is closed")

	hits.Store(0)
	noBody := transport.New(respond(&hits, func() *http.Response { return &http.Response{StatusCode: 503, Header: http.Header{}} }), opts...)
	resp, err = (&http.Client{Transport: noBody}).Get("https://api.example.com/v1")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode, "a 503 without a body is retried")
	assert.EqualValues(t, 2, hits.Load())
}

// TestUnrewindableBodies: a body without GetBody is sent once and never
// retried; a GetBody that fails ends the request with the previous
// response if it was small enough to keep, else with the error; every
// body is closed.
func TestUnrewindableBodies(t *testing.T) {
	noLeaks(t)
	clk := newFakeClock()
	opts := []transport.Option{transport.WithTestClock(clk.Now, clk.Sleep)}
	big := strings.Repeat("x", 5<<10)
	var discarded []*closeTracker
	var hits atomic.Int32
	base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		hits.Add(1)
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		b := &closeTracker{Reader: strings.NewReader(r.Header.Get("X-Reply"))}
		discarded = append(discarded, b)
		return &http.Response{StatusCode: 503, Header: http.Header{}, Body: b}, nil
	})
	tr := transport.New(base, opts...)
	post := func(reply string, getBody func() (io.ReadCloser, error)) (*closeTracker, *http.Response, error) {
		body := &closeTracker{Reader: strings.NewReader("payload")}
		req, err := http.NewRequest("POST", "https://api.example.com/v1", body)
		require.NoError(t, err)
		req.GetBody = getBody
		req.Header.Set("X-Reply", reply)
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			t.Cleanup(func() { resp.Body.Close() })
		}
		return body, resp, err
	}

	body, resp, err := post("short", nil)
	require.NoError(t, err)
	assert.Equal(t, 503, resp.StatusCode, "not retried")
	assert.EqualValues(t, 1, hits.Load())
	assert.True(t, body.closed.Load())

	failing := func() (io.ReadCloser, error) { return nil, errors.New("cannot rewind") }
	_, resp, err = post("short", failing)
	require.NoError(t, err)
	assert.Equal(t, 503, resp.StatusCode, "the previous response, kept in memory")
	got, _ := io.ReadAll(resp.Body)
	assert.Equal(t, "short", string(got))
	assert.EqualValues(t, 2, hits.Load())

	_, resp, err = post(big, failing)
	assert.Nil(t, resp)
	assert.ErrorContains(t, err, "transport: GetBody: cannot rewind", "the previous response was too big to keep")
	assert.EqualValues(t, 3, hits.Load())
	for i, b := range discarded {
		if i != 0 { // the first went back to the caller, who closes it
			assert.True(t, b.closed.Load(), "response %d closed", i)
		}
	}
}

// TestBadCostAndKey: a cost the bucket can never admit, an empty key or a
// done context fail the request at once, with a typed error, sending
// nothing and closing the body.
func TestBadCostAndKey(t *testing.T) {
	noLeaks(t)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		opts []transport.Option
		want error
	}{
		{"negative cost", context.Background(), []transport.Option{
			transport.WithCost(func(*http.Request) bucket.Cost { return bucket.N(-1) })}, bucket.ErrInvalidCost},
		{"NaN cost", context.Background(), []transport.Option{
			transport.WithCost(func(*http.Request) bucket.Cost { return bucket.N(math.NaN()) })}, bucket.ErrInvalidCost},
		{"cost above burst", context.Background(), []transport.Option{
			transport.WithCost(func(*http.Request) bucket.Cost { return bucket.N(11) })}, bucket.ErrExceedsBurst},
		{"empty key", context.Background(), []transport.Option{
			transport.WithKey(func(*http.Request) string { return "" })}, bucket.ErrInvalidKey},
		{"done context", done, nil, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hits atomic.Int32
			tr := transport.New(respond(&hits), append(tc.opts, transport.WithBucket(bucket.NewLocal(bucket.PerSecond(10))))...)
			body := &closeTracker{Reader: strings.NewReader("payload")}
			req, err := http.NewRequestWithContext(tc.ctx, "POST", "https://api.example.com/v1", body)
			require.NoError(t, err)
			resp, err := tr.RoundTrip(req)
			assert.Nil(t, resp)
			assert.ErrorIs(t, err, tc.want)
			assert.Zero(t, hits.Load(), "nothing sent")
			assert.True(t, body.closed.Load(), "the body is closed")
		})
	}
}

// TestRetryAfterLongestDuration: a Retry-After that saturates at the
// longest time.Duration, honoured in full (MaxRetryAfter at its largest),
// pauses the key until a time in the future, not one wrapped into the
// past; the request with a deadline is not retried, and the next one on
// the key fails at once.
func TestRetryAfterLongestDuration(t *testing.T) {
	noLeaks(t)
	var hits atomic.Int32
	clk := newFakeClock()
	tr := transport.New(respond(&hits, withHeader(429, "Retry-After", "99999999999999999999")),
		transport.WithBucket(bucket.NewLocal(bucket.PerSecond(100))), transport.WithTestClock(clk.Now, clk.Sleep),
		transport.WithRetry(transport.Retry{MaxRetryAfter: time.Duration(math.MaxInt64)}))
	ctx, cancel := context.WithDeadline(context.Background(), clk.Now().Add(time.Hour))
	defer cancel()
	resp, err := get(t, tr, ctx, "https://api.example.com/v1")
	require.NoError(t, err)
	assert.Equal(t, 429, resp.StatusCode, "the retry would pass the deadline")
	assert.Empty(t, clk.Sleeps())

	_, err = get(t, tr, ctx, "https://api.example.com/v1")
	var we *bucket.WaitError
	require.ErrorAs(t, err, &we)
	assert.Greater(t, we.RetryAfter, 100*365*24*time.Hour, "paused until far in the future")
	assert.EqualValues(t, 1, hits.Load(), "nothing sent")
	assert.Empty(t, clk.Sleeps())
}
