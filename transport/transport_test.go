package transport_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/transport"
)

// frozen is a bucket clock that never moves: nothing refills.
type frozen struct{}

func (frozen) Now() time.Time { return time.Unix(1_800_000_000, 0) }

func get(t *testing.T, tr http.RoundTripper, ctx context.Context, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	if err == nil {
		t.Cleanup(func() { resp.Body.Close() })
	}
	return resp, err
}

func TestNewWithRedisBucketAsIs(t *testing.T) {
	rdb := redistest.Client(t)
	s := newScript()
	defer s.Close()
	// The one-liner, with only the key made unique to this run.
	tr := transport.New(nil, transport.WithBucket(bucket.NewRedis(rdb, bucket.PerSecond(20))))
	client := &http.Client{Transport: tr}
	for range 3 {
		resp, err := client.Get(s.URL + fmt.Sprintf("/?run=%d", time.Now().UnixNano()))
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode)
	}
	assert.EqualValues(t, 3, s.hits.Load())
}

func TestNewClient(t *testing.T) {
	s := newScript(status(503))
	defer s.Close()
	c := transport.NewClient(transport.WithRetry(transport.Retry{InitialInterval: time.Millisecond}))
	resp, err := c.Get(s.URL)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.EqualValues(t, 2, s.hits.Load())
}

func TestEveryAttemptSpendsTokens(t *testing.T) {
	// Retry-After: 0, or the 429 would pause the key (bucket.Observe).
	s := newScript(status(503), status(429, "Retry-After", "0"))
	defer s.Close()
	b := bucket.NewLocal(bucket.PerSecond(10), bucket.WithClock(frozen{}))
	clk := newFakeClock()
	tr := transport.New(nil, transport.WithBucket(b), transport.WithTestClock(clk.Now, clk.Sleep),
		transport.WithKey(func(*http.Request) string { return "k" }),
		transport.WithCost(func(*http.Request) bucket.Cost { return bucket.N(2) }))
	resp, err := get(t, tr, context.Background(), s.URL)
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, bucket.Cost{bucket.Requests: 4}, b.Tokens("k"), "3 attempts of 2")
}

func TestWaitErrorIsDeadline(t *testing.T) {
	s := newScript()
	defer s.Close()
	b := bucket.NewLocal(bucket.PerSecond(1), bucket.WithClock(frozen{}))
	tr := transport.New(nil, transport.WithBucket(b))
	_, err := get(t, tr, context.Background(), s.URL)
	require.NoError(t, err)

	t.Run("context deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		resp, err := get(t, tr, ctx, s.URL)
		assert.Nil(t, resp)
		assert.ErrorIs(t, err, bucket.ErrDeadline)
		var we *bucket.WaitError
		assert.ErrorAs(t, err, &we)
		assert.Less(t, time.Since(start), 500*time.Millisecond, "fails at once")
	})
	t.Run("through http.Client", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", s.URL, nil)
		_, err := (&http.Client{Transport: tr}).Do(req)
		assert.ErrorIs(t, err, bucket.ErrDeadline)
	})
	t.Run("max wait", func(t *testing.T) {
		tr := transport.New(nil, transport.WithBucket(b), transport.WithMaxWait(50*time.Millisecond))
		body := &closeTracker{Reader: strings.NewReader("x")}
		req, _ := http.NewRequest("POST", s.URL, body)
		_, err := tr.RoundTrip(req)
		assert.ErrorIs(t, err, bucket.ErrDeadline)
		assert.True(t, body.closed.Load(), "the request body is closed")
	})
	t.Run("cost beyond burst", func(t *testing.T) {
		tr := transport.New(nil, transport.WithBucket(b),
			transport.WithCost(func(*http.Request) bucket.Cost { return bucket.N(5) }))
		_, err := get(t, tr, context.Background(), s.URL)
		assert.ErrorIs(t, err, bucket.ErrExceedsBurst)
	})
	assert.EqualValues(t, 1, s.hits.Load())
}

func TestRetryNotSentReturnsPreviousResponse(t *testing.T) {
	s := newScript(status(503, "Retry-After-Ms", "5"))
	defer s.Close()
	b := bucket.NewLocal(bucket.PerSecond(1), bucket.WithClock(frozen{}))
	tr := transport.New(nil, transport.WithBucket(b), transport.WithMaxWait(10*time.Millisecond))
	resp, err := get(t, tr, context.Background(), s.URL)
	require.NoError(t, err)
	assert.Equal(t, 503, resp.StatusCode)
	got, _ := io.ReadAll(resp.Body)
	assert.Equal(t, status(503).body, string(got))
	assert.EqualValues(t, 1, s.hits.Load())
}

func TestRetryAfterPausesKey(t *testing.T) {
	s := newScript(status(429, "Retry-After", "30"))
	defer s.Close()
	clk := newFakeClock()
	tr := transport.New(nil, transport.WithTestClock(clk.Now, clk.Sleep),
		transport.WithKey(transport.CredentialKey), transport.WithRetry(transport.Retry{MaxAttempts: 1}))
	send := func(ctx context.Context, apiKey string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", s.URL, nil)
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}
	resp, err := send(context.Background(), "sk-a")
	require.NoError(t, err)
	assert.Equal(t, 429, resp.StatusCode)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = send(ctx, "sk-a")
	assert.ErrorIs(t, err, bucket.ErrDeadline, "paused past the deadline: fails at once")
	assert.EqualValues(t, 1, s.hits.Load())

	resp, err = send(context.Background(), "sk-b")
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode, "another key is not paused")
	assert.Empty(t, clk.Sleeps())

	resp, err = send(context.Background(), "sk-a")
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, []time.Duration{30 * time.Second}, clk.Sleeps(), "waited out the pause")
}

// TestRetryAfterOnErrorStatusDoesNotPauseKey: only a 429, 503 or 529 may
// pause a key for the fleet. A Retry-After on a 400, 401, 404 or 500 paused
// it in the bucket for every process; a retried 500 still waits out its own
// Retry-After before the retry.
func TestRetryAfterOnErrorStatusDoesNotPauseKey(t *testing.T) {
	for _, code := range []int{400, 401, 404, 500} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			s := newScript(status(code, "Retry-After", "2"))
			defer s.Close()
			b := bucket.NewLocal(bucket.PerSecond(10), bucket.WithClock(frozen{}))
			clk := newFakeClock()
			tr := transport.New(nil, transport.WithBucket(b), transport.WithTestClock(clk.Now, clk.Sleep),
				transport.WithTestRand(func() float64 { return 0 }),
				transport.WithKey(func(*http.Request) string { return "k" }))
			resp, err := get(t, tr, context.Background(), s.URL)
			require.NoError(t, err)
			if code == 500 {
				assert.Equal(t, 200, resp.StatusCode, "retried")
				assert.Equal(t, []time.Duration{2 * time.Second}, clk.Sleeps(), "after its Retry-After")
			} else {
				assert.Equal(t, code, resp.StatusCode, "not retried")
			}
			r, err := b.Reserve(context.Background(), "k", bucket.N(1), 0)
			require.NoError(t, err)
			assert.True(t, r.OK, "the key is not paused")
			assert.Zero(t, r.Delay)
		})
	}
}

func TestBreaker(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var code atomic.Int32
	code.Store(429)
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path == "/hang" {
			<-r.Context().Done()
			return
		}
		if c := code.Load(); c == 429 {
			// Retry-After: 0, or the 429 would pause the key (bucket.Observe).
			w.Header().Set("Retry-After", "0")
		}
		w.WriteHeader(int(code.Load()))
	}))
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	b := bucket.NewLocal(bucket.PerSecond(1000), bucket.WithClock(frozen{}))
	cb := &countingBucket{Bucket: b}
	var changes []string
	tr := transport.New(base,
		transport.WithBucket(cb),
		transport.WithKey(func(*http.Request) string { return "k" }),
		transport.WithRetry(transport.Retry{MaxAttempts: 1}),
		transport.WithBreaker(gobreaker.Settings{
			Name:        "upstream",
			Timeout:     200 * time.Millisecond,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 2 },
			OnStateChange: func(_ string, from, to gobreaker.State) {
				changes = append(changes, from.String()+">"+to.String())
			},
		}))
	call := func() (*http.Response, error) {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}
	tokens := func() float64 { return b.Tokens("k")[bucket.Requests] }

	// 429s and cancellations do not trip it.
	for range 5 {
		resp, err := call()
		require.NoError(t, err)
		assert.Equal(t, 429, resp.StatusCode)
	}
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := get(t, tr, ctx, srv.URL+"/hang")
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	}
	assert.Empty(t, changes, "still closed")

	// 5xx trip it.
	code.Store(500)
	for range 2 {
		resp, err := call()
		require.NoError(t, err)
		assert.Equal(t, 500, resp.StatusCode)
	}
	assert.Equal(t, []string{"closed>open"}, changes)

	// Open: fail at once, send nothing, spend nothing.
	before, n, reserves := tokens(), hits.Load(), cb.reserves.Load()
	body := &closeTracker{Reader: strings.NewReader("x")}
	req, _ := http.NewRequest("POST", srv.URL, body)
	resp, err := tr.RoundTrip(req)
	assert.Nil(t, resp)
	assert.ErrorIs(t, err, transport.ErrCircuitOpen)
	assert.ErrorIs(t, err, gobreaker.ErrOpenState)
	var be *transport.BreakerError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, gobreaker.StateOpen, be.State)
	assert.Equal(t, "upstream", be.Name)
	assert.True(t, body.closed.Load())
	assert.Equal(t, n, hits.Load(), "nothing sent")
	assert.Equal(t, before, tokens(), "no token spent")
	assert.Equal(t, reserves, cb.reserves.Load(), "the bucket is not even asked")

	// Half-open, the probe fails: open again.
	time.Sleep(250 * time.Millisecond)
	resp, err = call()
	require.NoError(t, err)
	assert.Equal(t, 500, resp.StatusCode)
	_, err = call()
	assert.ErrorIs(t, err, transport.ErrCircuitOpen)
	assert.Equal(t, []string{"closed>open", "open>half-open", "half-open>open"}, changes)

	// Half-open, one probe at a time; it succeeds: closed.
	time.Sleep(250 * time.Millisecond)
	code.Store(200)
	probe := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/hang", nil)
		_, err := tr.RoundTrip(req)
		probe <- err
	}()
	require.Eventually(t, func() bool { return hits.Load() == n+2 }, 5*time.Second, time.Millisecond)
	before = tokens()
	_, err = call()
	assert.ErrorIs(t, err, transport.ErrCircuitOpen)
	assert.ErrorIs(t, err, gobreaker.ErrTooManyRequests)
	require.ErrorAs(t, err, &be)
	assert.Equal(t, gobreaker.StateHalfOpen, be.State)
	assert.Equal(t, before, tokens(), "the refused attempt's cost is refunded")
	assert.ErrorIs(t, <-probe, context.DeadlineExceeded) // excluded: still half-open
	resp, err = call()
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, []string{"closed>open", "open>half-open", "half-open>open", "open>half-open", "half-open>closed"}, changes)
	resp, err = call()
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
}

func TestBreakerCountsConnectionErrors(t *testing.T) {
	fails := 0
	base := roundTripperFunc(func(*http.Request) (*http.Response, error) {
		fails++
		return nil, errors.New("connection reset by peer")
	})
	tr := transport.New(base, transport.WithRetry(transport.Retry{MaxAttempts: 1}),
		transport.WithBreaker(gobreaker.Settings{ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 3 }}))
	for range 3 {
		_, err := get(t, tr, context.Background(), "http://upstream.invalid")
		assert.EqualError(t, err, "connection reset by peer")
	}
	_, err := get(t, tr, context.Background(), "http://upstream.invalid")
	assert.ErrorIs(t, err, transport.ErrCircuitOpen)
	assert.Equal(t, 3, fails)
}

func TestStreaming(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const events = 5
	ack := make(chan struct{})
	var first atomic.Bool
	first.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if first.Swap(false) {
			w.Header().Set("Retry-After-Ms", "1")
			w.WriteHeader(503)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := range events {
			fmt.Fprintf(w, "data: %d\n\n", i)
			fl.Flush()
			select { // the next chunk is written only once this one was read
			case <-ack:
			case <-time.After(5 * time.Second):
				return
			case <-r.Context().Done():
				return
			}
		}
	}))
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr := transport.New(base)
	req, _ := http.NewRequest("GET", srv.URL, nil)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	rd := bufio.NewReader(resp.Body)
	for i := range events {
		line, err := rd.ReadString('\n')
		require.NoError(t, err, "chunk %d", i)
		assert.Equal(t, fmt.Sprintf("data: %d\n", i), line)
		_, err = rd.ReadString('\n')
		require.NoError(t, err)
		ack <- struct{}{}
	}
	require.NoError(t, resp.Body.Close())
}

func TestKeys(t *testing.T) {
	req := func(hdr ...string) *http.Request {
		r, _ := http.NewRequest("GET", "https://api.openai.com/v1/chat/completions?x=1", nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		return r
	}
	assert.Equal(t, "https://api.openai.com", transport.HostKey(req()))
	assert.Equal(t, "https://api.openai.com", transport.CredentialKey(req()))
	a := transport.CredentialKey(req("Authorization", "Bearer sk-secret-a"))
	assert.Equal(t, "https://api.openai.com#"+transport.Fingerprint("sk-secret-a"), a)
	assert.Len(t, transport.Fingerprint("sk-secret-a"), 12)
	assert.NotContains(t, a, "secret")
	assert.Equal(t, a, transport.CredentialKey(req("X-Api-Key", "sk-secret-a")), "same key, same bucket")
	assert.Equal(t, a, transport.CredentialKey(req("Api-Key", "sk-secret-a")))
	assert.NotEqual(t, a, transport.CredentialKey(req("Authorization", "Bearer sk-secret-b")))
}

func TestCloseIdleConnections(t *testing.T) {
	closed := false
	base := &idleCloser{RoundTripper: http.DefaultTransport, closed: &closed}
	transport.New(base).CloseIdleConnections()
	assert.True(t, closed)
	(&http.Client{Transport: transport.New(roundTripperFunc(nil))}).CloseIdleConnections() // no method: no-op
}

// countingBucket counts the calls to a Bucket.
type countingBucket struct {
	bucket.Bucket
	reserves atomic.Int32
}

func (c *countingBucket) Reserve(ctx context.Context, key string, cost bucket.Cost, maxWait time.Duration) (bucket.Reservation, error) {
	c.reserves.Add(1)
	return c.Bucket.Reserve(ctx, key, cost, maxWait)
}

type idleCloser struct {
	http.RoundTripper
	closed *bool
}

func (c *idleCloser) CloseIdleConnections() { *c.closed = true }

// pauseFixture is a server that answers its first request, after 50 ms
// (for others to reserve meanwhile), with 429 and Retry-After: 1, and the
// rest with 200; and a Transport with a Local bucket of 10/s, burst 1, that
// does not retry.
type pauseFixture struct {
	mu       sync.Mutex
	arrivals []time.Time // of the requests at the server
	srv      *httptest.Server
	tr       *transport.Transport
}

func newPauseFixture(t *testing.T) *pauseFixture {
	f := &pauseFixture{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.arrivals = append(f.arrivals, time.Now())
		first := len(f.arrivals) == 1
		f.mu.Unlock()
		if first {
			time.Sleep(50 * time.Millisecond)
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	t.Cleanup(f.srv.Close)
	b := bucket.NewLocal(bucket.Limit{Rate: 10, Burst: 1})
	f.tr = transport.New(nil, transport.WithBucket(b), transport.WithRetry(transport.Retry{MaxAttempts: 1}))
	return f
}

// get sends a request and returns its status and when it came back.
func (f *pauseFixture) get(t *testing.T) (int, time.Time) {
	resp, err := f.tr.RoundTrip(must(http.NewRequest("GET", f.srv.URL, nil)))
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode, time.Now()
}

// TestReservedSlotHeldThroughPause: a request whose slot was reserved
// before a 429 paused its key, and falls inside the pause, is held until the
// pause ends instead of being sent into it.
func TestReservedSlotHeldThroughPause(t *testing.T) {
	f := newPauseFixture(t)
	var wg sync.WaitGroup
	var refusedAt time.Time
	wg.Go(func() {
		code, at := f.get(t)
		assert.Equal(t, http.StatusTooManyRequests, code)
		refusedAt = at
	})
	time.Sleep(10 * time.Millisecond)
	code, _ := f.get(t) // its slot: 100 ms after the first; the pause: 1 s after the 429
	wg.Wait()
	assert.Equal(t, http.StatusOK, code)
	require.Len(t, f.arrivals, 2)
	assert.GreaterOrEqual(t, f.arrivals[1].Sub(refusedAt), 900*time.Millisecond, "held until the pause ended")
}

// TestHeldSlotsKeepTheirSpacing: the slots reserved before a pause began
// and due during it are dropped and reserved again after it, behind the
// slots due after it, all at the rate: neither sent as a herd at its end
// into a provider that has refilled only its burst, nor colliding with the
// slots that kept their times.
func TestHeldSlotsKeepTheirSpacing(t *testing.T) {
	f := newPauseFixture(t)
	var wg sync.WaitGroup
	wg.Go(func() {
		code, _ := f.get(t)
		assert.Equal(t, http.StatusTooManyRequests, code)
	})
	time.Sleep(10 * time.Millisecond)
	// Slots 100 ms to 1.4 s after the first; the pause ends 1.05 s after it.
	const queued = 14
	for range queued {
		wg.Go(func() {
			code, _ := f.get(t)
			assert.Equal(t, http.StatusOK, code)
		})
	}
	wg.Wait()
	require.Len(t, f.arrivals, queued+1)
	held := f.arrivals[1:]
	slices.SortFunc(held, func(a, b time.Time) int { return a.Compare(b) })
	assert.GreaterOrEqual(t, held[0].Sub(f.arrivals[0]), time.Second, "held by the pause")
	for i := 1; i < len(held); i++ {
		assert.GreaterOrEqual(t, held[i].Sub(held[i-1]), 60*time.Millisecond, "slot %d keeps its spacing", i+1)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
