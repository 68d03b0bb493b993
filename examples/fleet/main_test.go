package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestFleet builds the demo and runs it as a user would, against the
// embedded Redis and against a real redis-server, checking that the fleet
// admits at most the bound and at least 90% of it.
func TestFleet(t *testing.T) {
	bin := buildDemo(t)
	// 3 workers offer 60 requests/s to a bucket of 20/s: saturated. Over
	// the 3.95 s from first to last request the bucket admits about
	// 10 + 20×3.95 = 89. (Over 0.95 s, a loaded machine's stall cost 3 of
	// 29 once, below 90%; over 1.95 s, with the whole suite and two hogs
	// beside, 7 of 49 once: the run is long enough that one stall does not.)
	args := []string{"-workers", "3", "-requests", "80", "-interval", "50ms", "-capacity", "10", "-rate", "20"}

	t.Run("embedded", func(t *testing.T) {
		stdout, stderr, code := runDemo(t, bin, args...)
		require.Equal(t, 0, code, "stderr: %s", stderr)
		assert.Empty(t, stderr)
		checkOutput(t, stdout, 3, 80, 50*time.Millisecond, 10, 20, true)
	})
	t.Run("redis", func(t *testing.T) {
		addr := redistest.Addr(t) // host:port, the short form of -redis
		stdout, stderr, code := runDemo(t, bin, append(args, "-redis", addr)...)
		require.Equal(t, 0, code, "stderr: %s", stderr)
		assert.Empty(t, stderr)
		checkOutput(t, stdout, 3, 80, 50*time.Millisecond, 10, 20, true)
	})
	t.Run("one worker", func(t *testing.T) {
		stdout, stderr, code := runDemo(t, bin, "-workers", "1", "-requests", "3", "-interval", "10ms")
		require.Equal(t, 0, code, "stderr: %s", stderr)
		checkOutput(t, stdout, 1, 3, 10*time.Millisecond, 10, 5, false)
	})
	t.Run("bad flag", func(t *testing.T) {
		stdout, stderr, code := runDemo(t, bin, "-workers", "0")
		assert.Equal(t, 2, code)
		assert.Empty(t, stdout)
		assert.Contains(t, stderr, "fleet: -workers must be >= 1, got 0")
		assert.Contains(t, stderr, "Usage: fleet")
	})
	t.Run("unreachable redis", func(t *testing.T) {
		stdout, stderr, code := runDemo(t, bin, "-redis", "redis://user:secret@127.0.0.1:1")
		assert.Equal(t, 1, code)
		assert.Empty(t, stdout)
		assert.Contains(t, stderr, "fleet: cannot reach Redis at redis://user:xxxxx@127.0.0.1:1")
		assert.NotContains(t, stderr, "secret")
	})
}

func TestParseFlags(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, config{workers: 3, requests: 30, interval: 100 * time.Millisecond, capacity: 10, rate: 5}, c)

	c, err = parseFlags([]string{"-redis", "localhost:6380"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "redis://localhost:6380", c.redis)
	c, err = parseFlags([]string{"-redis", "rediss://u:p@h:1/2"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "rediss://u:p@h:1/2", c.redis)

	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"-workers", "0"}, "-workers must be >= 1, got 0"},
		{[]string{"-requests", "-1"}, "-requests must be >= 1, got -1"},
		{[]string{"-interval", "0s"}, "-interval must be > 0, got 0s"},
		{[]string{"-capacity", "0"}, "-capacity must be a number > 0, got 0"},
		{[]string{"-capacity", "NaN"}, "-capacity must be a number > 0, got NaN"},
		{[]string{"-rate", "-5"}, "-rate must be a number > 0, got -5"},
		{[]string{"-rate", "+Inf"}, "-rate must be a number > 0, got +Inf"},
		{[]string{"-redis", "redis://h:1/notadb"}, "-redis: "},
		{[]string{"-redis", "redis://u:s3cret@h:1/%zz"}, "-redis: not a valid URL"},
		{[]string{"-redis", "redis://u:s3cret@h:port/0"}, "-redis: not a valid URL"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-nosuchflag"}, "flag provided but not defined: -nosuchflag"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stderr bytes.Buffer
			_, err := parseFlags(tc.args, &stderr)
			assert.ErrorIs(t, err, errUsage)
			assert.Contains(t, stderr.String(), tc.msg)
			assert.Contains(t, stderr.String(), "Usage: fleet")
			assert.NotContains(t, stderr.String(), "s3cret")
		})
	}
}

func TestParseResult(t *testing.T) {
	r, err := parseResult(" allowed=11 end=1700000000123456789")
	require.NoError(t, err)
	assert.Equal(t, 11, r.allowed)
	assert.Equal(t, time.Unix(0, 1700000000123456789), r.end)

	_, err = parseResult(" allowed=x end=1")
	assert.Error(t, err)
}

// buildDemo builds the demo into a temporary directory, with the race
// detector if this test binary has it, and returns the executable's path.
func buildDemo(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("go command not found: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "fleet")
	args := []string{"build", "-o", bin}
	if raceEnabled() {
		args = append(args, "-race")
	}
	out, err := exec.Command(gobin, append(args, ".")...).CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// runDemo runs the demo and returns what it wrote and its exit status.
func runDemo(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	// A race-enabled binary sleeps 1 s at exit by default: skip that, in the
	// parent and its workers.
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
	err := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		code = exitErr.ExitCode()
	default:
		t.Fatalf("run %s: %v", bin, err)
	}
	require.NoError(t, ctx.Err(), "the demo did not finish in time; stdout:\n%s", out.String())
	return out.String(), errOut.String(), code
}

var (
	requestLine = regexp.MustCompile(`^\[worker (\d+)\] (\d{2,}) allowed=(true|false)$`)
	workerLine  = regexp.MustCompile(`^worker (\d+): allowed=(\d+)$`)
	totalLine   = regexp.MustCompile(`^total allowed: (\d+)$`)
	elapsedLine = regexp.MustCompile(`^elapsed: (\d+\.\d\d) s$`)
	boundLine   = regexp.MustCompile(`^bound: (\d+\.\d)$`)
)

// checkOutput checks the demo's output line by line: every request of
// every worker in order, one count per worker that matches them, and
// totals within the bound, and at least 90% of it if the run saturated the
// bucket.
func checkOutput(t *testing.T, out string, workers, requests int, interval time.Duration, capacity, rate float64, saturated bool) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, workers*requests+workers+3, "output:\n%s", out)

	next := make(map[int]int)    // worker → number of its next request
	allowed := make(map[int]int) // worker → allowed=true lines
	for _, line := range lines[:workers*requests] {
		m := requestLine.FindStringSubmatch(line)
		require.NotNil(t, m, "not a request line: %q", line)
		w, n := atoi(t, m[1]), atoi(t, m[2])
		require.True(t, w >= 1 && w <= workers, "line %q: no such worker", line)
		next[w]++
		require.Equal(t, next[w], n, "line %q: out of order", line)
		if m[3] == "true" {
			allowed[w]++
		}
	}
	sum := 0
	for i, line := range lines[workers*requests : workers*requests+workers] {
		m := workerLine.FindStringSubmatch(line)
		require.NotNil(t, m, "not a worker line: %q", line)
		w, n := atoi(t, m[1]), atoi(t, m[2])
		assert.Equal(t, i+1, w, "worker lines are in order")
		assert.Equal(t, requests, next[w], "requests of worker %d", w)
		assert.Equal(t, allowed[w], n, "allowed count of worker %d", w)
		sum += n
	}

	tail := lines[len(lines)-3:]
	m := totalLine.FindStringSubmatch(tail[0])
	require.NotNil(t, m, "not the total line: %q", tail[0])
	total := atoi(t, m[1])
	m = elapsedLine.FindStringSubmatch(tail[1])
	require.NotNil(t, m, "not the elapsed line: %q", tail[1])
	elapsed := atof(t, m[1])
	m = boundLine.FindStringSubmatch(tail[2])
	require.NotNil(t, m, "not the bound line: %q", tail[2])
	bound := atof(t, m[1])

	assert.Equal(t, sum, total, "total is the sum of the workers'")
	assert.GreaterOrEqual(t, elapsed, (time.Duration(requests-1)*interval).Seconds()-0.005,
		"elapsed covers the schedule")
	// elapsed and bound are rounded to 0.005 s and 0.05.
	assert.InDelta(t, capacity+rate*elapsed, bound, 0.05+rate*0.005+1e-9, "bound = capacity + rate × elapsed")
	assert.LessOrEqual(t, float64(total), bound+0.5, "total within the bound")
	if saturated {
		assert.GreaterOrEqual(t, float64(total), 0.9*bound, "total close to the bound")
	}
	t.Logf("total allowed %d, elapsed %.2f s, bound %.1f (%.0f%%)", total, elapsed, bound, 100*float64(total)/bound)
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}

func atof(t *testing.T, s string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(s, 64)
	require.NoError(t, err)
	return f
}
