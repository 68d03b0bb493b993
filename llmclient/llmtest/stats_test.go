package llmtest

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMaxInWindow(t *testing.T) {
	clk := newClock()
	h := NewHandler(Config{Requests: TokenBucket(10, time.Second, 10), Now: clk.Now})
	for range 11 {
		get(h) // 10 admitted at 0
	}
	for range 10 {
		clk.Advance(100 * time.Millisecond)
		require.Equal(t, http.StatusOK, get(h).Code) // one at each 100 ms
	}
	// A full bucket, then its refill: 10 at 0 and 9 in (0, 1s), the 10th at 1 s.
	assert.EqualValues(t, 19, h.MaxInWindow(Requests, time.Second))
	assert.EqualValues(t, 20, h.MaxInWindow(Requests, time.Second+1))
	assert.EqualValues(t, 10, h.MaxInWindow(Requests, 100*time.Millisecond))
	assert.EqualValues(t, 11, h.MaxInWindow(Requests, 100*time.Millisecond+1))
	assert.EqualValues(t, 10, h.MaxInWindow(Requests, 1))
	assert.EqualValues(t, 0, h.MaxInWindow(Requests, 0))
	assert.EqualValues(t, 0, h.MaxInWindow(Tokens, time.Hour), "plain calls cost no tokens")
}

func TestMaxInWindowOfTokens(t *testing.T) {
	clk := newClock()
	h := NewHandler(Config{ChargeCap: true, Tokens: SlidingWindow(100, time.Minute), Now: clk.Now})
	costs := []int{50, 30, 20, 40, 50}
	for _, c := range costs {
		chat(t, h, userMessage("", c-3))
		clk.Advance(20 * time.Second)
	}
	// Admitted: 50 at 0 s, 30 at 20 s, 20 at 40 s, 40 at 60 s (the first
	// one no longer counts); refused: 50 at 80 s (20+40+50 > 100).
	st := h.Stats()
	assert.EqualValues(t, 4, st.Accepted)
	assert.EqualValues(t, 1, st.Rejected)
	assert.EqualValues(t, 140, st.ChargedTokens)
	assert.EqualValues(t, 100, h.MaxInWindow(Tokens, time.Minute))
	assert.EqualValues(t, 100, h.MaxInWindow(Tokens, 40*time.Second+1))
	assert.EqualValues(t, 80, h.MaxInWindow(Tokens, 40*time.Second))
	assert.EqualValues(t, 140, h.MaxInWindow(Tokens, time.Minute+1))
	assert.EqualValues(t, 4, h.MaxInWindow(Requests, time.Hour))
}

func TestSeries(t *testing.T) {
	clk := newClock()
	h := NewHandler(Config{Requests: FixedWindow(2, time.Second), Now: clk.Now})
	assert.Nil(t, h.Series(time.Second), "nothing decided yet")
	clk.Advance(1500 * time.Millisecond)
	for range 3 {
		chat(t, h, userMessage("", 7)) // 10 tokens
	}
	clk.Advance(2 * time.Second)
	get(h)
	assert.Equal(t, []Point{
		{Start: epoch},
		{Start: epoch.Add(time.Second), Requests: 2, Tokens: 20, Rejected: 1},
		{Start: epoch.Add(2 * time.Second)},
		{Start: epoch.Add(3 * time.Second), Requests: 1},
	}, h.Series(time.Second))
	assert.Equal(t, []Point{
		{Start: epoch, Requests: 2, Tokens: 20, Rejected: 1},
		{Start: epoch.Add(3 * time.Second), Requests: 1},
	}, h.Series(3*time.Second))
	assert.Equal(t, 2.0, FixedWindow(2, time.Second).Rate()*time.Second.Seconds(), "the limit's line per interval")

	clk.Advance(time.Minute)
	h.Reset()
	assert.Nil(t, h.Series(time.Second))
	assert.Equal(t, Stats{}, h.Stats())
	assert.EqualValues(t, 0, h.MaxInWindow(Requests, time.Hour))
	get(h)
	assert.Equal(t, []Point{{Start: epoch.Add(time.Minute + 3500*time.Millisecond), Requests: 1}}, h.Series(time.Second))
}

func TestResetFillsTheLimits(t *testing.T) {
	clk := newClock()
	h := NewHandler(Config{Requests: TokenBucket(1, time.Hour, 1), Now: clk.Now})
	require.Equal(t, http.StatusOK, get(h).Code)
	require.Equal(t, http.StatusTooManyRequests, get(h).Code)
	h.Reset()
	assert.Equal(t, http.StatusOK, get(h).Code)
}

func TestFaults(t *testing.T) {
	for _, tc := range []struct {
		fault  Fault
		status int
		typ    string
		code   string
	}{
		{Overloaded, 529, "overloaded_error", ""},
		{Unavailable, http.StatusServiceUnavailable, "server_error", ""},
		{QuotaExhausted, http.StatusTooManyRequests, "insufficient_quota", "insufficient_quota"},
		{Fault(99), http.StatusInternalServerError, "server_error", ""},
	} {
		clk := newClock()
		var mu sync.Mutex
		var asked []time.Time
		h := NewHandler(Config{ChargeCap: true,
			Requests: FixedWindow(1, time.Minute),
			Headers:  OpenAIHeaders,
			Now:      clk.Now,
			// Fails during the second second.
			Fault: func(now time.Time) Fault {
				mu.Lock()
				defer mu.Unlock()
				asked = append(asked, now)
				if now.Sub(epoch) >= time.Second && now.Sub(epoch) < 2*time.Second {
					return tc.fault
				}
				return NoFault
			},
		})
		clk.Advance(time.Second)
		w := chat(t, h, userMessage("x", 0))
		assert.Equal(t, tc.status, w.Code, tc.fault)
		e := apiError(t, w)
		assert.Equal(t, tc.typ, e.Error.Type)
		if tc.code == "" {
			assert.Nil(t, e.Error.Code)
		} else {
			assert.Equal(t, tc.code, *e.Error.Code)
		}
		assert.Empty(t, w.Header().Get("Retry-After"))
		assert.Empty(t, w.Header().Get("X-Ratelimit-Remaining-Requests"), "the limits never saw it")

		clk.Advance(time.Second)
		assert.Equal(t, http.StatusOK, get(h).Code, "the limit is untouched")
		assert.Equal(t, Stats{Accepted: 1, Faulted: 1}, h.Stats())
		assert.Equal(t, []time.Time{epoch.Add(time.Second), epoch.Add(2 * time.Second)}, asked)
	}
}

// TestConcurrentTotals hammers a Server from many goroutines, each moving
// the shared clock, and checks that the counters add up and no window was
// admitted more than the sliding window's limit.
func TestConcurrentTotals(t *testing.T) {
	clk := newClock()
	srv := NewServer(Config{ChargeCap: true,
		Requests:     SlidingWindow(50, 100*time.Millisecond),
		Tokens:       FixedWindow(2000, time.Second),
		Headers:      OpenAIHeaders | AnthropicHeaders | IETFHeaders,
		RetryAfterMs: true,
		ReplyTokens:  8,
		Now:          clk.Now,
	})
	defer srv.Close()

	const workers, each = 16, 40
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var mu sync.Mutex
	codes := map[int]int64{}
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			for j := range each {
				clk.Advance(time.Millisecond)
				var resp *http.Response
				var err error
				if (i+j)%3 == 0 {
					resp, err = client.Get(srv.URL + "/ping")
				} else {
					resp, err = client.Post(srv.URL+"/chat/completions", "application/json",
						strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"abcdefgh"}],"max_tokens":20}`))
				}
				if !assert.NoError(t, err) {
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	st := srv.Stats()
	assert.Equal(t, int64(workers*each), st.Accepted+st.Rejected)
	assert.Equal(t, map[int]int64{200: st.Accepted, 429: st.Rejected}, codes)
	assert.Positive(t, st.Rejected)
	assert.LessOrEqual(t, srv.MaxInWindow(Requests, 100*time.Millisecond), int64(50))
	assert.LessOrEqual(t, srv.MaxInWindow(Tokens, time.Second), int64(2*2000))
	chats := st.PromptTokens / 5 // each prompt is 2+3 tokens
	assert.Equal(t, 5*chats, st.PromptTokens)
	assert.Equal(t, 8*chats, st.CompletionTokens)
	assert.Equal(t, 13*chats, st.TotalTokens)
	assert.Equal(t, 25*chats, st.ChargedTokens, "prompt + max_tokens, plain calls 0")

	var sum Point
	for _, p := range srv.Series(10 * time.Millisecond) {
		sum.Requests += p.Requests
		sum.Tokens += p.Tokens
		sum.Rejected += p.Rejected
	}
	assert.Equal(t, Point{Requests: st.Accepted, Tokens: st.ChargedTokens, Rejected: st.Rejected}, sum)
}
