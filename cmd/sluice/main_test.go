package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// binary is the sluice command, built once for the package's tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-cmd-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "sluice")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building sluice:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proxyProc is a sluice proxy process of a test's.
type proxyProc struct {
	cmd   *exec.Cmd
	URL   string // http://127.0.0.1:port
	Admin string
	log   *syncBuffer
	exit  chan error
}

// startProxy runs `sluice proxy --config file` with config written to a
// file, on free loopback ports, until t ends, and waits until it listens.
func startProxy(t testing.TB, config string, args ...string) *proxyProc {
	t.Helper()
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	require.NoError(t, os.WriteFile(file, []byte(config), 0o600))
	args = append([]string{"proxy", "--config", file, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}, args...)
	cmd := exec.Command(binary, args...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &proxyProc{cmd: cmd, log: &syncBuffer{}, exit: make(chan error, 1)}
	addrs := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			p.log.Write(append(line, '\n'))
			var rec struct{ Msg, Addr, Admin string }
			if json.Unmarshal(line, &rec) == nil && rec.Msg == "sluice proxy listening" {
				addrs <- [2]string{rec.Addr, rec.Admin}
			}
		}
	}()
	go func() { p.exit <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exit
		p.exit <- nil
		if t.Failed() {
			t.Logf("proxy log:\n%s", p.log.String())
		}
	})
	select {
	case a := <-addrs:
		p.URL, p.Admin = "http://"+a[0], "http://"+a[1]
	case err := <-p.exit:
		t.Fatalf("the proxy exited: %v\n%s", err, p.log.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the proxy did not listen within 30 s\n%s", p.log.String())
	}
	return p
}

// terminate sends SIGTERM and returns the exit code and how long the
// process took to exit.
func (p *proxyProc) terminate(t testing.TB, within time.Duration) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-p.exit:
		p.exit <- err
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return code, time.Since(start)
	case <-time.After(within):
		t.Fatalf("the proxy had not exited %v after SIGTERM", within)
	}
	return -1, 0
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestBadFlagsAndConfigRefusedAtStart: a limit out of range, a missing
// upstream, a config error: the command does not start, exits 2 and says
// which flag or which file, line and field.
func TestBadFlagsAndConfigRefusedAtStart(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("routes:\n  - prefix: /\n    upstream: http://127.0.0.1:1\n    limits:\n      requests: 0/s\n"), 0o600))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"proxy", "--upstream", "http://127.0.0.1:1", "--rpm", "-5"}, "--rpm: -5 is out of range"},
		{[]string{"proxy", "--upstream", "http://127.0.0.1:1", "--tpm", "1e12"}, `--tpm: "1000000000000/min" is out of range`},
		{[]string{"proxy", "--rpm", "60"}, "--upstream: must be an http:// or https:// URL with a host"},
		{[]string{"proxy", "--upstream", "http://127.0.0.1:1", "--preset", "anthropic", "--tpm", "100"}, "--tpm: the anthropic preset charges no tokens"},
		{[]string{"proxy", "--config", bad}, bad + ":5: routes[0].limits.requests: \"0/s\" is out of range"},
		{[]string{"proxy", "--config", bad, "--max-wait", "1s"}, "--max-wait does not go with --config"},
		{[]string{"serve"}, "usage: sluice proxy"},
	} {
		cmd := exec.Command(binary, tc.args...)
		var out bytes.Buffer
		cmd.Stderr = &out
		err := cmd.Run()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%v", tc.args)
		require.Equal(t, 2, ee.ExitCode(), "%v: %s", tc.args, out.String())
		require.Contains(t, out.String(), tc.want, "%v", tc.args)
	}
}
