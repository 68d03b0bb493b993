package transport_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/transport"
)

// TestOnePoisonedResponse: a fleet of three members (each its own client,
// bucket and Transport) on one Redis key; one response lies, once. Nine in
// ten later calls complete within twice the normal latency (a loaded
// machine's scheduler can stall one), none a second later than normal,
// and no key's TTL passes the horizon. Before, usage 1e15 stalled the key for 154 years and
// quota headers reporting 1e-6/s for 11 days.
func TestOnePoisonedResponse(t *testing.T) {
	const latency = 150 * time.Millisecond // twice it leaves room for a loaded machine's stalls
	for _, poison := range []struct {
		name    string
		body    string
		headers map[string]string
	}{
		{name: "usage 1e15", body: `{"usage":{"total_tokens":1e15}}`},
		{name: "usage 1e300", body: `{"usage":{"total_tokens":1e300}}`},
		{name: "usage -5", body: `{"usage":{"total_tokens":-5}}`},
		{name: "usage NaN", body: `{"usage":{"total_tokens":NaN}}`},
		{name: "quota 1e-6/s", body: `{"usage":{"total_tokens":100}}`, headers: map[string]string{
			"x-ratelimit-limit-requests": "1", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1000000s",
			"x-ratelimit-limit-tokens": "1", "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1000000s"}},
		{name: "quota reset 100000h", body: `{"usage":{"total_tokens":100}}`, headers: map[string]string{
			"x-ratelimit-limit-requests": "1000", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "100000h"}},
		{name: "X-RateLimit reset in 2128", body: `{"usage":{"total_tokens":100}}`, headers: map[string]string{
			"x-ratelimit-limit": "1", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "5000000000"}},
		{name: "IETF window 1e6 s", body: `{"usage":{"total_tokens":100}}`, headers: map[string]string{
			"RateLimit-Policy": `"p";q=1;w=1000000`, "RateLimit": `"p";r=0;t=1000000`}},
	} {
		t.Run(poison.name, func(t *testing.T) {
			var poisoned atomic.Bool
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(latency)
				w.Header().Set("Content-Type", "application/json")
				if r.Header.Get("X-Poison") == "1" && !poisoned.Swap(true) {
					for k, v := range poison.headers {
						w.Header().Set(k, v)
					}
					w.Write([]byte(poison.body))
					return
				}
				w.Write([]byte(`{"usage":{"total_tokens":100}}`))
			}))
			t.Cleanup(srv.Close)
			prefix := "poison" + strings.NewReplacer(" ", "", "-", "", ".", "").Replace(poison.name)
			var clients []*http.Client
			for range 3 {
				rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), ContextTimeoutEnabled: true})
				t.Cleanup(func() { rdb.Close() })
				b := bucket.NewRedis(rdb, bucket.PerSecond(100), bucket.WithPrefix(prefix),
					bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 10000, Burst: 10000}))
				clients = append(clients, &http.Client{Transport: transport.New(nil, transport.WithBucket(b),
					transport.WithCost(llmclient.RequestCost(nil)), transport.WithUsage(llmclient.MeterUsage))})
			}
			call := func(c *http.Client, poison bool) time.Duration {
				req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL,
					strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`))
				require.NoError(t, err)
				if poison {
					req.Header.Set("X-Poison", "1")
				}
				start := time.Now()
				resp, err := c.Do(req)
				require.NoError(t, err)
				_, err = io.ReadAll(resp.Body)
				require.NoError(t, err)
				require.NoError(t, resp.Body.Close())
				require.Equal(t, http.StatusOK, resp.StatusCode)
				return time.Since(start)
			}
			run := func(calls int) []time.Duration {
				var mu sync.Mutex
				var out []time.Duration
				var wg sync.WaitGroup
				for i := range 6 {
					wg.Go(func() {
						for range calls / 6 {
							d := call(clients[i%3], false)
							mu.Lock()
							out = append(out, d)
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				slices.Sort(out)
				return out
			}
			normal := run(24)
			median := normal[len(normal)/2]
			call(clients[0], true)
			require.True(t, poisoned.Load())
			after := run(48)
			p90 := after[len(after)*9/10]
			t.Logf("normal: median %v, slowest %v; after the poison: median %v, 90th percentile %v, slowest %v",
				median, normal[len(normal)-1], after[len(after)/2], p90, after[len(after)-1])
			// A poison that held the key would hold every call that came
			// while it lasted: at least the 6 under way, an eighth of them.
			// One call the scheduler of a loaded machine stalls is not one
			// (seen in CI at load 10: 596 ms, with the 90th at 1.1 times).
			assert.LessOrEqual(t, p90, 2*median, "the later calls within twice the normal latency")
			assert.LessOrEqual(t, after[len(after)-1], median+time.Second, "and none held")

			rdb := redistest.Client(t)
			names, err := rdb.Keys(t.Context(), prefix+":*").Result()
			require.NoError(t, err)
			require.NotEmpty(t, names)
			for _, name := range names {
				ttl, err := rdb.PTTL(t.Context(), name).Result()
				require.NoError(t, err)
				assert.LessOrEqual(t, ttl, 120*time.Second+time.Minute+5*time.Second, "%s: the horizon, a refill and its slack", name)
			}
		})
	}
}
