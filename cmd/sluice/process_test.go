package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// streamUpstream serves server-sent event streams of events events, gap
// apart, counting those open.
type streamUpstream struct {
	events int
	gap    time.Duration
	mu     sync.Mutex
	open   int
}

func (u *streamUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	u.open++
	u.mu.Unlock()
	defer func() { u.mu.Lock(); u.open--; u.mu.Unlock() }()
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	for i := range u.events {
		if i > 0 {
			select {
			case <-time.After(u.gap):
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
		if rc.Flush() != nil {
			return
		}
	}
}

// serveUpstream serves h on loopback until t ends and returns its URL.
func serveUpstream(t testing.TB, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

func streamConfig(upstream string, drain time.Duration) string {
	return fmt.Sprintf(`drain_timeout: %v
routes:
  - prefix: /
    upstream: %s
    limits:
      requests: 100000/s
`, drain, upstream)
}

// openStreams opens n streams through the proxy at url, each read to its
// end in a goroutine of its own once its first event has come; it returns
// when every stream has its first event, and a channel that gets each
// stream's count of events.
func openStreams(t testing.TB, url string, n int) <-chan int {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: n}}
	counts := make(chan int, n)
	var first sync.WaitGroup
	for range n {
		first.Add(1)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions",
				strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("Authorization", "Bearer sk-stream")
			resp, err := client.Do(req)
			if err != nil {
				first.Done()
				counts <- -1
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			got, once := 0, false
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "data: ") {
					got++
					if !once {
						once = true
						first.Done()
					}
				}
			}
			if !once {
				first.Done()
			}
			counts <- got
		}()
	}
	first.Wait()
	return counts
}

// TestSIGTERMDrains100OpenStreams (acceptance 6): SIGTERM while 100
// streams of 2 s are open: every stream completes with all its events, and
// the proxy exits 0 within the drain timeout.
func TestSIGTERMDrains100OpenStreams(t *testing.T) {
	const streams, events = 100, 21
	up := &streamUpstream{events: events, gap: 100 * time.Millisecond}
	drain := 20 * time.Second
	p := startProxy(t, streamConfig(serveUpstream(t, up), drain))
	counts := openStreams(t, p.URL, streams)
	code, took := p.terminate(t, drain+10*time.Second)
	assert.Equal(t, 0, code, "exit code")
	assert.Less(t, took, drain, "exited within the drain timeout")
	complete := 0
	for range streams {
		if <-counts == events {
			complete++
		}
	}
	assert.Equal(t, streams, complete, "streams that got every event")
	t.Logf("SIGTERM with %d open streams: exit %d after %v, %d streams complete", streams, code, took.Round(time.Millisecond), complete)
}

// TestRSSWith1000Streams (acceptance 7): the proxy's peak resident memory
// (VmHWM) while 1,000 streams run through it at once stays under 256 MB.
// Set SLUICE_PROXY_LONG=1 to run it.
func TestRSSWith1000Streams(t *testing.T) {
	if os.Getenv("SLUICE_PROXY_LONG") != "1" {
		t.Skip("set SLUICE_PROXY_LONG=1: 1,000 streams of 3 s")
	}
	const streams, events = 1000, 31
	up := &streamUpstream{events: events, gap: 100 * time.Millisecond}
	p := startProxy(t, streamConfig(serveUpstream(t, up), 30*time.Second))
	counts := openStreams(t, p.URL, streams)
	hwm := vmHWM(t, p.cmd.Process.Pid)
	complete := 0
	for range streams {
		if <-counts == events {
			complete++
		}
	}
	hwm = max(hwm, vmHWM(t, p.cmd.Process.Pid))
	t.Logf("%d concurrent streams: peak RSS %.1f MB, %d complete", streams, float64(hwm)/(1<<20), complete)
	assert.Equal(t, streams, complete)
	assert.Less(t, hwm, int64(256<<20), "peak RSS")
}

// vmHWM reads the peak resident set size of process pid, in bytes.
func vmHWM(t testing.TB, pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/pid/status")
	return 0
}
