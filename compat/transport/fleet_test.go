package transport_test

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/sluicehq/sluice/llmclient/llmtest"
)

// The workload of sluice's TestFleet (in its transport package): fleetCalls
// calls by fleetProcs × fleetGoroutines goroutines against a server that
// allows fleetRate requests per second with a burst of fleetRate.
const (
	fleetProcs      = 4
	fleetGoroutines = 8
	fleetCalls      = 300
	fleetRate       = 20
)

// TestFleetRetryablehttp measures TestFleet's workload through
// go-retryablehttp's default client (its logger silenced), its 32
// goroutines in this process, for comparison with sluice's figures: a
// measurement, it asserts nothing.
func TestFleetRetryablehttp(t *testing.T) {
	if testing.Short() {
		t.Skip("the fleet measurement takes about 30s")
	}
	ideal := time.Duration(float64(fleetCalls-fleetRate) / fleetRate * float64(time.Second)) // burst, then the rate
	srv := llmtest.NewServer(llmtest.Config{Requests: llmtest.TokenBucket(fleetRate, time.Second, fleetRate), RetryAfterMs: true})
	defer srv.Close()
	rc := retryablehttp.NewClient()
	rc.Logger = nil
	defer rc.HTTPClient.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var (
		ok, failed atomic.Int64
		next       atomic.Int64
		wg         sync.WaitGroup
	)
	start := time.Now()
	for range fleetProcs * fleetGoroutines {
		wg.Go(func() {
			for next.Add(1) <= fleetCalls {
				req, _ := retryablehttp.NewRequestWithContext(ctx, "GET", srv.URL+"/ping", nil)
				resp, err := rc.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ok.Add(1)
				} else {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	makespan := time.Since(start)
	st := srv.Stats()
	t.Logf("go-retryablehttp default client (%d goroutines): %d/%d calls succeeded, %d failed; server saw %d requests, %d rejected with 429; makespan %.2fs (ideal %.2fs, %+.1f%%)",
		fleetProcs*fleetGoroutines, ok.Load(), fleetCalls, failed.Load(), st.Accepted+st.Rejected, st.Rejected,
		makespan.Seconds(), ideal.Seconds(), 100*(makespan.Seconds()/ideal.Seconds()-1))
}
