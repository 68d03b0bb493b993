package proxy

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// percentile returns the p-th percentile (0-100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(float64(len(s))*p/100))]
}

// timeCall makes a chat completion call to url and returns the time to
// the response's first body byte and to its end.
func timeCall(t testing.TB, c *http.Client, url string, body string) (first, whole time.Duration) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer sk-bench")
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := c.Do(req)
	require.NoError(t, err)
	br := bufio.NewReader(resp.Body)
	_, err = br.ReadByte()
	require.NoError(t, err)
	first = time.Since(start)
	io.Copy(io.Discard, br)
	resp.Body.Close()
	return first, time.Since(start)
}

// TestOverheadBesideDirect (acceptances 2 and 3): sequential calls on
// loopback, alternately direct and through the proxy (OpenAI preset, a
// Local bucket with room to spare, so no wait), 2,000 of each: the
// latency the proxy adds at p50 and p99 (each percentile of the proxied
// calls less the same of the direct ones), for a JSON answer and for the
// first byte of a stream. Set SLUICE_PROXY_LONG=1 to run it; the figures
// are in docs/proxy.md.
func TestOverheadBesideDirect(t *testing.T) {
	if os.Getenv("SLUICE_PROXY_LONG") != "1" {
		t.Skip("set SLUICE_PROXY_LONG=1: 8,000 calls, figures for docs/proxy.md")
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if strings.Contains(r.URL.RawQuery, "stream") {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Write([]byte("data: {\"choices\":[]}\n\n"))
			http.NewResponseController(w).Flush()
			w.Write([]byte("data: [DONE]\n\n"))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":16,"total_tokens":21}}`))
	}))
	defer up.Close()
	p := start(t, oneRoute(up.URL, presetOpenAI, Limits{Requests: "1000000/s", Tokens: "100000000/s"}))
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	const n = 2000
	for _, kind := range []string{"json", "stream"} {
		var direct, proxied []time.Duration
		for i := range 2*n + 100 {
			url := up.URL
			if i%2 == 1 {
				url = p.URL
			}
			first, whole := timeCall(t, c, url+"/v1/chat/completions?"+kind, chatBody(kind == "stream"))
			d := whole
			if kind == "stream" {
				d = first
			}
			if i < 100 {
				continue // warm up
			}
			if i%2 == 1 {
				proxied = append(proxied, d)
			} else {
				direct = append(direct, d)
			}
		}
		p50 := percentile(proxied, 50) - percentile(direct, 50)
		p99 := percentile(proxied, 99) - percentile(direct, 99)
		t.Logf("%s: direct p50 %v p99 %v; proxied p50 %v p99 %v; added p50 %v p99 %v", kind,
			percentile(direct, 50), percentile(direct, 99), percentile(proxied, 50), percentile(proxied, 99), p50, p99)
		assert.Less(t, p50, time.Millisecond, "%s: added at p50", kind)
		if kind == "json" {
			assert.Less(t, p99, 3*time.Millisecond, "%s: added at p99", kind)
		}
	}
}
