package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/examples/internal/demo"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
)

// TestMain makes the test binary a worker when run calls it as one: the
// workers of the runs below are copies of it.
func TestMain(m *testing.M) {
	if spec, ok := os.LookupEnv(workerEnv); ok {
		os.Exit(workerMain(spec))
	}
	os.Exit(m.Run())
}

// TestRun runs a small fleet end to end, against the fake API and then
// against an API given by -base-url, and checks the summary it prints and
// the chart it draws.
func TestRun(t *testing.T) {
	// 2 processes × 4 goroutines, 30 calls of about 560 tokens: some 17,000
	// tokens at 5,000 a second, the binding limit (they need about 9 of the
	// 20 requests a second).
	small := []string{"-procs", "2", "-workers", "4", "-jobs", "30", "-rpm", "1200", "-tpm", "300000"}

	t.Run("fake API", func(t *testing.T) {
		chart := filepath.Join(t.TempDir(), "chart.png")
		out := runFleet(t, append(small, "-chart", chart)...)
		s := parseSummary(t, out)
		assert.Equal(t, 30, s.ok, "ok")
		assert.Equal(t, 0, s.failed, "failed")
		assert.LessOrEqual(t, s.throttled, 0.01*s.answered, "429s")
		assert.GreaterOrEqual(t, s.answered, 30.0, "requests answered")
		assert.GreaterOrEqual(t, s.tokensPct, 90.0, "tokens/s against the limit")
		assert.InDelta(t, 0, s.usageDiff, 2, "reconciled usage against the API's count")
		assert.InDelta(t, s.bucket, s.api, 0.02*s.api)
		assert.Contains(t, out, "(the fake API's hidden limit)")
		assert.Contains(t, out, "chart:    "+chart)
		checkChart(t, chart, "\x89PNG\r\n\x1a\n")
	})

	t.Run("base URL", func(t *testing.T) {
		api := llmtest.NewServer(llmtest.Config{
			Tokens:      llmtest.TokenBucket(300_000, time.Minute, 10_000),
			Headers:     llmtest.OpenAIHeaders,
			ReplyTokens: maxCompletion,
			Latency:     20 * time.Millisecond,
		})
		defer api.Close()
		chart := filepath.Join(t.TempDir(), "chart.svg")
		t.Setenv("OPENAI_API_KEY", "sk-from-env")
		out := runFleet(t, append(small, "-chart", chart, "-base-url", api.URL, "-burst", "500ms")...)
		s := parseSummary(t, out)
		st := api.Stats()
		assert.Equal(t, 30, s.ok, "ok")
		assert.Equal(t, 0, s.failed, "failed")
		assert.Equal(t, float64(st.Rejected), s.throttled, "429s seen by the workers")
		assert.Equal(t, float64(st.Accepted+st.Rejected), s.answered, "requests sent")
		assert.Equal(t, float64(st.TotalTokens), s.api, "usage reported")
		assert.InDelta(t, 0, s.usageDiff, 2, "reconciled usage against the responses'")
		assert.Contains(t, out, "(as configured)")
		checkChart(t, chart, "<?xml")
	})
}

// runFleet runs the parent with args and returns its stdout.
func runFleet(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, args, &stdout, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	assert.NotContains(t, stderr.String(), "\r", "no bar drawn when stderr is not a terminal")
	t.Logf("\n%s", stdout.String())
	return stdout.String()
}

// summaryNumbers are the figures of a printed summary.
type summaryNumbers struct {
	ok, failed          int
	throttled, answered float64
	tokensPct           float64
	bucket, api         float64
	usageDiff           float64
}

var (
	okLine     = regexp.MustCompile(`(?m)^ok:\s+(\d+)$`)
	failedLine = regexp.MustCompile(`(?m)^failed:\s+(\d+)$`)
	throttLine = regexp.MustCompile(`(?m)^429s:\s+(\d+) of (\d+) requests the API answered \((\d+\.\d\d)%\)$`)
	callsLine  = regexp.MustCompile(`(?m)^calls/s:\s+\d+\.\d \(limit \d+\.\d: \d+\.\d%\)$`)
	tokensLine = regexp.MustCompile(`(?m)^tokens/s:\s+[\d,]+ \(limit [\d,]+: (\d+\.\d)%(?:; \d+\.\d% from 2 s to \d+ s)?\)$`)
	spanLine   = regexp.MustCompile(`(?m)^makespan: \d+\.\d\d s \(ideal (?:\d+\.\d\d s: [+-]\d+\.\d%|0 s: the limit's burst holds the whole run)\)$`)
	usageLine  = regexp.MustCompile(`(?m)^usage:\s+bucket ([\d,]+) tokens, (?:API|responses) ([\d,]+) \(([+-]\d+\.\d\d)%\)$`)
)

// parseSummary reads the figures of the summary in out, failing the test
// if a line is missing or malformed.
func parseSummary(t *testing.T, out string) summaryNumbers {
	t.Helper()
	find := func(re *regexp.Regexp) []string {
		m := re.FindStringSubmatch(out)
		require.NotNil(t, m, "no line matching %s in:\n%s", re, out)
		return m
	}
	num := func(s string) float64 {
		v, err := strconv.ParseFloat(strings.ReplaceAll(s, ",", ""), 64)
		require.NoError(t, err)
		return v
	}
	var s summaryNumbers
	s.ok = int(num(find(okLine)[1]))
	s.failed = int(num(find(failedLine)[1]))
	m := find(throttLine)
	s.throttled, s.answered = num(m[1]), num(m[2])
	find(callsLine)
	s.tokensPct = num(find(tokensLine)[1])
	find(spanLine)
	m = find(usageLine)
	s.bucket, s.api, s.usageDiff = num(m[1]), num(m[2]), num(m[3])
	return s
}

// checkChart checks that file was written and starts with magic.
func checkChart(t *testing.T, file, magic string) {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err, "the chart was not written")
	assert.Greater(t, len(b), 10_000, "the chart's size")
	assert.True(t, bytes.HasPrefix(b, []byte(magic)), "the chart starts with %q", magic)
}

func TestParseFlags(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "sk-env")
	c, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, config{
		procs: 4, workers: 8, jobs: 360, rpm: 1500, tpm: 600_000, burst: time.Second, seed: 1,
		model: "gpt-4.1-mini", chart: "llmfleet.png",
	}, c, "the defaults; the API key is read only with -base-url")

	c, err = parseFlags([]string{"-base-url", "https://api.example.com/v1", "-redis", "localhost:6380"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "sk-env", c.apiKey)
	assert.Equal(t, "redis://localhost:6380", c.redis)

	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"-procs", "0"}, "-procs must be >= 1, got 0"},
		{[]string{"-workers", "0"}, "-workers must be >= 1, got 0"},
		{[]string{"-jobs", "-1"}, "-jobs must be >= 1, got -1"},
		{[]string{"-rpm", "0"}, "-rpm must be >= 1, got 0"},
		{[]string{"-tpm", "0"}, "-tpm must be >= 1, got 0"},
		{[]string{"-burst", "0s"}, "-burst must be > 0, got 0s"},
		{[]string{"-chart", "out.gif"}, `-chart must name a .png or .svg file, got "out.gif"`},
		{[]string{"-base-url", "api.example.com"}, `-base-url must be an http or https URL, got "api.example.com"`},
		{[]string{"-redis", "redis://h:1/notadb"}, "-redis: "},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-nosuchflag"}, "flag provided but not defined: -nosuchflag"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stderr bytes.Buffer
			_, err := parseFlags(tc.args, &stderr)
			assert.ErrorIs(t, err, errUsage)
			assert.Contains(t, stderr.String(), tc.msg)
			assert.Contains(t, stderr.String(), "Usage: llmfleet")
		})
	}
}

func TestJobIsDeterministic(t *testing.T) {
	a, b := job(1, 7, "m"), job(1, 7, "m")
	assert.Equal(t, a, b)
	assert.NotEqual(t, a, job(2, 7, "m"), "another seed, another prompt")
	for i := range 200 {
		req := job(1, i, "m")
		require.Len(t, req.Messages, 2)
		n := len(req.Messages[1].Content)
		assert.True(t, n >= 4*minPrompt && n <= 4*maxPrompt, "prompt of %d characters", n)
		assert.True(t, req.MaxTokens >= minCompletion && req.MaxTokens <= maxCompletion)
		assert.LessOrEqual(t, llmclient.Estimate(req), maxJobTokens, "the charge fits the bucket's burst")
	}
}

func TestProgressOnTerminal(t *testing.T) {
	var buf bytes.Buffer
	p := &progress{w: &buf, tty: true, total: 10, start: time.Now().Add(-2 * time.Second)}
	p.add(true, 1000)
	p.add(false, 0)
	p.draw(false)
	p.draw(true)
	out := buf.String()
	assert.True(t, strings.HasPrefix(out, "\r"), "redrawn in place: %q", out)
	assert.True(t, strings.HasSuffix(out, "\n"), "the last draw ends the line: %q", out)
	assert.Contains(t, out, " 20% 2/10 calls (1 failed)")
}

func TestGroup(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 600000: "600,000", 1234567.6: "1,234,568", -4200: "-4,200"} {
		assert.Equal(t, want, group(v), "group(%v)", v)
	}
}

// TestMetrics scrapes every worker's metrics while the fleet runs: each
// shows every bucket metric, and the transport's.
func TestMetrics(t *testing.T) {
	base := freePorts(t, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		// 2 processes × 4 goroutines, about 6 s at the limit.
		done <- run(ctx, []string{"-procs", "2", "-workers", "4", "-jobs", "80", "-rpm", "1200", "-tpm", "300000",
			"-chart", "", "-metrics", net.JoinHostPort("127.0.0.1", strconv.Itoa(base))}, &stdout, &stderr)
	}()
	for k := range 2 {
		url := fmt.Sprintf("http://127.0.0.1:%d/metrics", base+k)
		var missing []string
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			resp, err := http.Get(url)
			if err != nil {
				continue // not serving yet
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			fams := demo.Families(string(b))
			missing = missing[:0]
			for _, f := range append(demo.BucketFamilies, "sluice_transport_attempts_total", "sluice_transport_wait_duration_seconds") {
				if _, ok := fams[f]; !ok {
					missing = append(missing, f)
				}
			}
			if len(missing) == 0 {
				break
			}
		}
		assert.Empty(t, missing, "worker %d: metrics missing from the scrape", k+1)
	}
	require.NoError(t, <-done, stderr.String())
	out := stdout.String()
	assert.Contains(t, out, fmt.Sprintf("metrics:  worker 2 at http://127.0.0.1:%d/metrics while it runs", base+1))
	assert.Equal(t, 80, parseSummary(t, out).ok)
}

// freePorts returns the first of n consecutive ports that are free now.
func freePorts(t *testing.T, n int) int {
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		base := ln.Addr().(*net.TCPAddr).Port
		lns := []net.Listener{ln}
		ok := base+n-1 <= 65535
		for k := 1; k < n && ok; k++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(base+k)))
			if ok = err == nil; ok {
				lns = append(lns, l)
			}
		}
		for _, l := range lns {
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free consecutive ports")
	return 0
}
