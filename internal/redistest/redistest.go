// Package redistest starts private redis-server processes for tests.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Strict reports whether tests that need a real Redis must fail instead of
// skipping when none can be started: set SLUICE_STRICT=1 (CI does).
func Strict() bool { return os.Getenv("SLUICE_STRICT") == "1" }

// Server is a redis-server process of a test's own, on a free port of
// 127.0.0.1, keeping nothing on disk.
type Server struct {
	Addr string
	Port int

	conf string   // a configuration file to start with, for a sentinel
	env  []string // added to the process's environment

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts a redis-server on a free port and waits until it answers.
// extra arguments are passed to redis-server (e.g. "--cluster-enabled", "yes").
func Start(extra ...string) (*Server, error) {
	return startConf("", nil, extra)
}

// startConf is Start with a configuration file, if conf is not empty, and
// env added to the server's environment.
func startConf(conf string, env, extra []string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redistest: redis-server binary not found on PATH: %w", err)
	}
	var lastErr error
	for range 3 { // a free port can be taken between probing and binding
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, conf: conf, env: env}
		if lastErr = s.start(bin, extra); lastErr == nil {
			return s, nil
		}
	}
	return nil, lastErr
}

func (s *Server) start(bin string, extra []string) error {
	dir, err := os.MkdirTemp("", "sluice-redis-")
	if err != nil {
		return err
	}
	var args []string
	if s.conf != "" {
		args = []string{s.conf, "--sentinel"}
	}
	args = append(append(args,
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--daemonize", "no", "--loglevel", "warning",
	), extra...)
	cmd := exec.Command(bin, args...)
	if s.env != nil {
		cmd.Env = append(os.Environ(), s.env...)
	}
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("redistest: start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); os.RemoveAll(dir); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	if err := s.waitReady(5*time.Second, done); err != nil {
		s.Stop()
		return err
	}
	return nil
}

// waitReady waits until the server started answers, or until its process
// has exited (done is closed): a server that could not start, for one whose
// port another process took meanwhile, fails at once, so that Restart can
// try again.
func (s *Server) waitReady(timeout time.Duration, done <-chan struct{}) error {
	// go-redis retries a refused dial after 100 ms, longer than a server
	// takes to start.
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1,
		DialerRetryBackoff: func(int) time.Duration { return 2 * time.Millisecond }})
	defer c.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil || redis.IsAuthError(err) { // it answers, if only to ask for a password
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: redis-server on %s not ready: %w", s.Addr, err)
		}
		select {
		case <-done:
			return fmt.Errorf("redistest: redis-server on %s exited before it answered: %w", s.Addr, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Stop kills the server and waits for it to exit. Stopping twice is fine.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
}

// Pause stops the server's process (SIGSTOP) without closing its
// connections: it accepts no more and answers nothing until Resume.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues the server's process after Pause.
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig os.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("redistest: server not running")
	}
	return s.cmd.Process.Signal(sig)
}

// Restart starts the server again on the same port after Stop.
func (s *Server) Restart(extra ...string) error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.start(bin, extra)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

var (
	pkgServer *Server
	errPkg    = errors.New("redistest: Main was not called")
)

// Main runs a test package with a private redis-server shared by its tests:
// call it from TestMain. If none can be started, tests that call Client or
// Addr skip (or fail, with SLUICE_STRICT=1).
func Main(m *testing.M) {
	pkgServer, errPkg = Start()
	code := m.Run()
	if pkgServer != nil {
		pkgServer.Stop()
	}
	os.Exit(code)
}

// Tests that use redistest, and the worker processes they start (which
// exit before Main), keep go-redis quiet: servers stopped on purpose, and
// the failed dials that follow, are no news.
func init() { redis.SetLogger(quiet{}) }

// quiet is a go-redis logger that logs nothing.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// Addr returns the address of the package's redis-server, or skips t.
func Addr(t testing.TB) string {
	t.Helper()
	if pkgServer == nil {
		Unavailable(t, errPkg)
	}
	return pkgServer.Addr
}

// Client returns a client of the package's redis-server, closed when t ends.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: Addr(t)})
	t.Cleanup(func() { c.Close() })
	return c
}

// Unavailable skips t because no real Redis could be had, or fails it in
// strict mode.
func Unavailable(t testing.TB, err error) {
	t.Helper()
	if Strict() {
		t.Fatalf("real Redis required (SLUICE_STRICT=1) but unavailable: %v", err)
	}
	t.Skipf("skipping: no real Redis (%v); install redis-server to run this test", err)
}

// Own starts a redis-server for t alone (for tests that stop or restart
// it); it is stopped when t ends.
func Own(t testing.TB, extra ...string) *Server {
	t.Helper()
	s, err := Start(extra...)
	if err != nil {
		Unavailable(t, err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Cluster starts a Redis Cluster of masters nodes (no replicas) for t alone
// and returns their addresses once every slot is served; the nodes are
// stopped when t ends.
func Cluster(t testing.TB, masters int) []string {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		Unavailable(t, fmt.Errorf("redistest: redis-cli binary not found on PATH: %w", err))
	}
	addrs := make([]string, masters)
	for i := range addrs {
		addrs[i] = Own(t, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000").Addr
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, addr := range addrs { // every node: each learns the state on its own
		c := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("redistest: cluster node %s not ready: %v %q", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	return addrs
}

// Sentinel is a Redis master, its replica and a sentinel watching them,
// each a Server of a test's own.
type Sentinel struct {
	MasterName string   // the name the sentinel knows the master by
	Addrs      []string // the sentinel's address
	Master     *Server
	Replica    *Server
	Sentinel   *Server
}

// StartSentinel starts a master, a replica and a sentinel (quorum 1, master
// down after 1 s) for t alone, and returns them once the replica is in sync
// and the sentinel knows both; they are stopped when t ends. A failover
// (SENTINEL FAILOVER, or the master stopped) makes the replica the master.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	const name = "sluice"
	master := Own(t, "--repl-diskless-sync-delay", "0") // sync the replica at once
	replica := Own(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port), "--repl-diskless-sync-delay", "0")
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	cfg := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds %[1]s 1000\n"+
		"sentinel failover-timeout %[1]s 5000\n", name, master.Port)
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	sent, err := startConf(conf, nil, nil)
	if err != nil {
		Unavailable(t, err)
	}
	t.Cleanup(sent.Stop)

	sc := redis.NewSentinelClient(&redis.Options{Addr: sent.Addr})
	defer sc.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		// The sentinel finds the replica through the master's INFO.
		replicas, err := sc.Replicas(context.Background(), name).Result()
		if err == nil && len(replicas) == 1 && replicas[0]["flags"] == "slave" &&
			replicas[0]["master-link-status"] == "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: sentinel does not see the replica in sync: %v %v", err, replicas)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return &Sentinel{MasterName: name, Addrs: []string{sent.Addr}, Master: master, Replica: replica, Sentinel: sent}
}

// MasterAddr returns the address the sentinel gives for the master now.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addrs[0]})
	defer sc.Close()
	hp, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}
