package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/llmclient/llmtest"
)

// sdkCall makes a chat completion call through url as the official SDKs
// do: a 429 or 503 that says x-should-retry: true is tried again after its
// retry-after-ms, up to 10 times. It reports whether the call succeeded.
func sdkCall(c *http.Client, url string) bool {
	for range 11 {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-test","max_tokens":16,"messages":[{"role":"user","content":"Hello there"}]}`))
		req.Header.Set("Authorization", "Bearer sk-outage")
		resp, err := c.Do(req)
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return true
		}
		if resp.Header.Get("X-Should-Retry") != "true" {
			return false
		}
		ms, _ := strconv.Atoi(resp.Header.Get("Retry-After-Ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
	}
	return false
}

// TestRedisKilledFor3s (acceptance 5): two proxies sharing one
// redis-server, 16 clients calling as the SDKs do for 9 s against llmtest
// at 20 requests a second; Redis is killed 3 s in and restarted (empty) 3 s
// later. No call fails, and the fleet sent the upstream (admitted or
// refused) at most the limit's burst plus its rate times the time plus one
// share burst (burst/2: each proxy falls back to half the limit), over the
// run and over any second. Set SLUICE_PROXY_LONG=1 to run it.
func TestRedisKilledFor3s(t *testing.T) {
	if os.Getenv("SLUICE_PROXY_LONG") != "1" {
		t.Skip("set SLUICE_PROXY_LONG=1: a 9 s run")
	}
	const rate, clients = 20, 16
	rs := redistest.Own(t)
	srv := llmtest.NewServer(llmtest.Config{Requests: llmtest.TokenBucket(rate, time.Second, rate),
		Headers: llmtest.OpenAIHeaders, RetryAfterMs: true, Latency: 10 * time.Millisecond})
	defer srv.Close()
	config := fmt.Sprintf(`redis:
  url: redis://%s
routes:
  - prefix: /
    upstream: %s
    limits:
      requests: %d/s
`, rs.Addr, strings.TrimSuffix(srv.URL, "/v1"), rate)
	proxies := []*proxyProc{startProxy(t, config), startProxy(t, config)}

	var ok, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		c := &http.Client{}
		url := proxies[i%2].URL
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if sdkCall(c, url) {
					ok.Add(1)
				} else {
					failed.Add(1)
				}
			}
		})
	}
	time.Sleep(3 * time.Second)
	rs.Stop()
	time.Sleep(3 * time.Second)
	require.NoError(t, rs.Restart())
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()

	st := srv.Stats()
	const width = 100 * time.Millisecond
	pts := srv.Series(width)
	for len(pts) > 0 && pts[0].Requests+pts[0].Rejected == 0 {
		pts = pts[1:] // before the first call
	}
	span := time.Duration(len(pts)) * width
	sent := st.Accepted + st.Rejected
	whole := float64(rate) + rate*span.Seconds() + rate/2
	var most int64 // sent in any second: 10 points
	for i := range pts {
		var n int64
		for _, p := range pts[i:min(i+10, len(pts))] {
			n += p.Requests + p.Rejected
		}
		most = max(most, n)
	}
	t.Logf("calls ok %d, failed %d; the upstream got %d (%d 429s) over %v, bound %.0f; most in a second %d, bound %d",
		ok.Load(), failed.Load(), sent, st.Rejected, span, whole, most, rate+rate+rate/2)
	assert.Zero(t, failed.Load(), "calls that failed")
	assert.LessOrEqual(t, float64(sent), whole, "sent over the run: burst + rate*T + a share burst")
	assert.LessOrEqual(t, most, int64(rate+rate+rate/2), "sent in any second: burst + rate + a share burst")
}
