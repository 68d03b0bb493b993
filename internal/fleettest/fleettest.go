// Package fleettest starts a test binary again as the worker processes of a
// fleet test, for sluice's tests in every module of the repository: a
// worker reads its configuration from an environment variable, says
// "ready" on stdout, waits for the start time on stdin, and reports on
// stdout; and it watches a Redis bucket's decreases and pauses.
package fleettest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Worker is one worker process.
type Worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	stderr strings.Builder
}

// Start starts this test binary, running no test, as a worker with cfg, as
// JSON, in the environment variable env; ctx kills it.
func Start(ctx context.Context, env string, cfg any) (*Worker, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	w := &Worker{cmd: exec.CommandContext(ctx, os.Args[0], "-test.run=^$")}
	w.cmd.Env = append(os.Environ(), env+"="+string(b))
	w.cmd.Stderr = &w.stderr
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	w.stdout = bufio.NewReader(out)
	return w, w.cmd.Start()
}

// AwaitReady waits for every worker's "ready".
func AwaitReady(workers []*Worker) error {
	for i, w := range workers {
		if line, err := w.stdout.ReadString('\n'); err != nil || line != "ready\n" {
			return fmt.Errorf("worker %d not ready: %q %v: %s", i+1, line, err, w.stderr.String())
		}
	}
	return nil
}

// Release tells every worker the start time, and closes its stdin.
func Release(workers []*Worker, start time.Time) error {
	for _, w := range workers {
		if _, err := fmt.Fprintln(w.stdin, start.UnixNano()); err != nil {
			return err
		}
		w.stdin.Close()
	}
	return nil
}

// Report waits for worker i (counted from 0) to end and decodes what it
// reported, as JSON, into r.
func (w *Worker) Report(i int, r any) error {
	out, err := io.ReadAll(w.stdout)
	if err != nil {
		return err
	}
	if err := w.cmd.Wait(); err != nil {
		return fmt.Errorf("worker %d: %w: %s", i+1, err, w.stderr.String())
	}
	if err := json.Unmarshal(out, r); err != nil {
		return fmt.Errorf("worker %d output %q: %w", i+1, out, err)
	}
	return nil
}

// Wait waits for the worker to end; it is a no-op once waited for, by Wait
// or Report.
func (w *Worker) Wait() { w.cmd.Wait() }

// Stderr returns what the worker wrote on stderr; call it once the worker
// has ended.
func (w *Worker) Stderr() string { return w.stderr.String() }

// WatchDecreases polls the adaptive state of the Redis key base (see
// bucket's redis_lua.go) until ctx is done or the returned function is
// called, which returns the decreases seen: when, after start, and to what
// fraction of the ceiling.
func WatchDecreases(ctx context.Context, addr, base string, start time.Time) func() string {
	w := Watch(ctx, addr, base, start)
	return func() string { return w().Cuts }
}

// Watched is what Watch saw of a key's adaptive state.
type Watched struct {
	// Cuts are the decreases: when, in seconds after the start, and to
	// what fraction of the ceiling ("2.31s:0.700").
	Cuts string
	// Pauses are the pauses seen, each as its end and its length when
	// first seen, in seconds after the start ("2.85s:0.54s"); a pause
	// that came and went, or was lengthened, between two samples is
	// missed.
	Pauses string
	// NumPauses counts them.
	NumPauses int
}

// watchEvery is how often Watch samples.
const watchEvery = 10 * time.Millisecond

// Watch polls the adaptive state of the Redis key base (see bucket's
// redis_lua.go) every watchEvery until ctx is done or the returned
// function is called, which returns what it saw.
func Watch(ctx context.Context, addr, base string, start time.Time) func() Watched {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	ctx, cancel := context.WithCancel(ctx)
	var (
		cuts, pauses []string // read once done is closed
		seen, ended  string
		done         = make(chan struct{})
	)
	go func() {
		defer close(done)
		defer rdb.Close()
		tick := time.NewTicker(watchEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			s, err := rdb.HMGet(ctx, base, "e", "a", "d", "p").Result()
			if err != nil {
				continue
			}
			now := time.Now()
			e, _ := s[0].(string)
			as, _ := s[1].(string)
			ds, _ := s[2].(string)
			if ps, _ := s[3].(string); ps != "" && ps != ended {
				ended = ps
				p, _ := strconv.ParseInt(ps, 10, 64)
				if end := time.UnixMicro(p); end.After(now) {
					pauses = append(pauses, fmt.Sprintf("%.2fs:%.2fs", end.Sub(start).Seconds(), end.Sub(now).Seconds()))
				}
			}
			if e == seen || as == "" || ds == "" { // no decrease, or one forgotten
				continue
			}
			seen = e
			a, _ := strconv.ParseFloat(as, 64)
			d, _ := strconv.ParseInt(ds, 10, 64)
			cuts = append(cuts, fmt.Sprintf("%.2fs:%.3f", time.UnixMicro(d).Sub(start).Seconds(), a/1e6))
		}
	}()
	return func() Watched {
		cancel()
		<-done
		return Watched{Cuts: strings.Join(cuts, " "), Pauses: strings.Join(pauses, " "), NumPauses: len(pauses)}
	}
}

// stallTick is how often WatchStalls looks at the clock.
const stallTick = 5 * time.Millisecond

// WatchStalls measures, until the returned function is called, how late
// this process's timers fire: the longest a ticker of stallTick came late,
// which a machine too busy to run the process (or a process frozen) makes
// long. It is how a worker tells a run the machine stalled from one sluice
// got wrong.
func WatchStalls() func() time.Duration {
	stop, done := make(chan struct{}), make(chan time.Duration)
	go func() {
		tick := time.NewTicker(stallTick)
		defer tick.Stop()
		var worst time.Duration
		last := time.Now()
		for {
			select {
			case <-stop:
				done <- worst
				return
			case <-tick.C: // the time it fired would hide how late it is read
				now := time.Now()
				worst = max(worst, now.Sub(last)-stallTick)
				last = now
			}
		}
	}()
	return func() time.Duration {
		close(stop)
		return <-done
	}
}

// Pid returns the worker's process ID.
func (w *Worker) Pid() int { return w.cmd.Process.Pid }

// Kill kills the worker at once (SIGKILL): it cleans nothing up.
func (w *Worker) Kill() error { return w.cmd.Process.Kill() }

// Ready is the worker's side of AwaitReady and Release: it says "ready" on
// stdout and returns the start time that Release sends on stdin.
func Ready() (time.Time, error) {
	fmt.Println("ready")
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		return time.Time{}, fmt.Errorf("start time: %w", err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("start time: %w", err)
	}
	return time.Unix(0, ns), nil
}

// Tally is what a worker's calls came to.
type Tally struct {
	OK   int    // calls that succeeded
	Lost int    // the others
	Err  string // the first of the others' errors
	Last int64  // Unix nanoseconds of the last call's end
}

// Run makes the calls first, first+step, ... below n, from goroutines
// goroutines that each take the next until all are made, and tallies them:
// a call succeeds if call returns nil.
func Run(first, step, n, goroutines int, call func(i int) error) Tally {
	var (
		mu   sync.Mutex
		t    Tally
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range goroutines {
		wg.Go(func() {
			for {
				i := first + step*int(next.Add(1)-1)
				if i >= n {
					return
				}
				err := call(i)
				now := time.Now().UnixNano()
				mu.Lock()
				if err == nil {
					t.OK++
				} else {
					t.Lost++
					if t.Err == "" {
						t.Err = err.Error()
					}
				}
				t.Last = max(t.Last, now)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return t
}

// Get makes calls GETs of url through client, within ctx, from goroutines
// goroutines, and tallies them: a call succeeds if it is answered 200 and
// its body read.
func Get(ctx context.Context, client *http.Client, url string, calls, goroutines int) Tally {
	return Run(0, 1, calls, goroutines, func(int) error { return get(ctx, client, url) })
}

// get makes one GET of url and reads its body.
func get(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return errors.New("status " + strconv.Itoa(resp.StatusCode))
	}
	return nil
}
