package bucket_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The fault matrix measures what a fleet is admitted on one key while Redis
// misbehaves, one fault per row, under each failure policy, and prints a
// Markdown table. It is a measurement of a few minutes, not part of CI:
//
//	SLUICE_FAULT_MATRIX=1 go test ./bucket -run 'TestFaultMatrix$' -v -timeout 20m
//
// (about 4 minutes; -run 'TestFaultMatrix$/RTT' runs some rows only).
// SLUICE_FAULT_MATRIX_ASSERT=1 also holds every row to invariant 11: no call
// lost while failing open, except to a misconfiguration, which every call
// must report (an error that is not ErrUnavailable); and, under either
// policy, admitted ≤ Burst + Rate·T + Burst/n (+1).
//
// The fleet is matrixProcs worker processes (the test binary again, running
// TestFaultMatrixWorker) of matrixGoroutines goroutines each, calling
// bucket.Wait in a loop through a redistest.Proxy in front of the row's
// Redis. Admitted is the number of Waits the workers report returned
// without error; T runs from the start, before which no worker calls, to
// the later of the last such return and the run's end. (Not from the first
// return: a return is recorded when its goroutine next runs, on a loaded
// machine well after Redis or a share admitted it, and T must hold every
// admission.)
const (
	matrixEnv       = "SLUICE_FAULT_MATRIX"
	matrixAssertEnv = "SLUICE_FAULT_MATRIX_ASSERT"
	matrixWorkerEnv = "SLUICE_BUCKET_MATRIX_WORKER"

	matrixProcs      = 4
	matrixGoroutines = 8
	matrixDuration   = 6 * time.Second
	matrixMid        = 2 * time.Second // when a mid-run fault strikes
	matrixGrace      = 2 * time.Second // how long a Wait may outlast the run
)

var matrixLimit = bucket.Limit{Rate: 50, Burst: 50}

// matrixRow is one fault: the server's arguments, what to set up before
// the workers start, and what to do at a moment of the run.
type matrixRow struct {
	name      string
	misconfig bool     // every call must fail with a configuration error
	server    []string // extra arguments of the row's redis-server
	setup     func(e *matrixRun)
	at        time.Duration // when act runs, from the start
	act       func(e *matrixRun)
}

// matrixRun is a row being run.
type matrixRun struct {
	t          *testing.T
	server     *redistest.Server // the row's Redis (the master)
	args       []string          // its arguments, to restart it with
	proxy      *redistest.Proxy  // what the workers connect to
	pass       string            // the server's password, for direct
	clientPass string            // the workers' password
	done       chan struct{}     // closed by end
	endOnce    sync.Once
	mid        func() // what act does, if setup made it
	notes      []string
}

// end marks the run's end.
func (e *matrixRun) end() { e.endOnce.Do(func() { close(e.done) }) }

// direct returns a client of the row's server that bypasses the proxy.
func (e *matrixRun) direct() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: e.server.Addr, Password: e.pass, ReadTimeout: 5 * time.Second, MaxRetries: -1})
	e.t.Cleanup(func() { c.Close() })
	return c
}

// do runs a command on c, noting an error.
func (e *matrixRun) do(c *redis.Client, args ...any) {
	if err := c.Do(context.Background(), args...).Err(); err != nil {
		e.notes = append(e.notes, fmt.Sprintf("%v: %v", args, err))
	}
}

// replica starts a replica of the row's server (with its clock offset by
// skew, if not 0) and waits until it is in sync.
func (e *matrixRun) replica(skew time.Duration) *redistest.Server {
	args := []string{"--replicaof", "127.0.0.1", strconv.Itoa(e.server.Port)}
	var r *redistest.Server
	if skew != 0 {
		r = redistest.OwnSkewed(e.t, skew, args...)
	} else {
		r = redistest.Own(e.t, args...)
	}
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return r
		}
		require.True(e.t, time.Now().Before(deadline), "replica not in sync: %v %s", err, info)
		time.Sleep(20 * time.Millisecond)
	}
}

// fillMemory caps the server's memory 2 MB above what it uses, with policy,
// and keeps it full until the run ends by writing 4 KB cache keys that
// expire in a minute.
func (e *matrixRun) fillMemory(policy string) {
	c := e.direct()
	ctx := context.Background()
	info, err := c.Info(ctx, "memory").Result()
	require.NoError(e.t, err)
	var mem int64
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			mem, err = strconv.ParseInt(v, 10, 64)
			require.NoError(e.t, err)
		}
	}
	require.NotZero(e.t, mem)
	require.NoError(e.t, c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(mem+2<<20, 10)).Err())
	require.NoError(e.t, c.ConfigSet(ctx, "maxmemory-policy", policy).Err())
	value := strings.Repeat("x", 4<<10)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; {
			select {
			case <-e.done:
				return
			default:
			}
			c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for range 20 {
					p.Set(ctx, "cache:"+strconv.Itoa(i), value, time.Minute)
					i++
				}
				return nil
			})
			time.Sleep(5 * time.Millisecond)
		}
	})
	e.t.Cleanup(func() { e.end(); wg.Wait() }) // before the server stops: cleanups run last first
	e.notes = append(e.notes, fmt.Sprintf("maxmemory %d KB", (mem+2<<20)>>10))
}

func matrixRows() []matrixRow {
	rtt := func(d time.Duration) matrixRow {
		return matrixRow{name: fmt.Sprintf("RTT %d ms", d.Milliseconds()), setup: func(e *matrixRun) { e.proxy.SetLatency(d / 2) }}
	}
	return []matrixRow{
		rtt(0), rtt(50 * time.Millisecond), rtt(100 * time.Millisecond), rtt(200 * time.Millisecond),
		{name: "WRONGPASS", misconfig: true, server: []string{"--requirepass", "right"},
			setup: func(e *matrixRun) { e.pass, e.clientPass = "right", "wrong" }},
		{name: "READONLY (replica)", misconfig: true,
			setup: func(e *matrixRun) { e.proxy.SetUpstream(e.replica(0).Addr) }},
		{name: "maxmemory allkeys-lru", misconfig: true, setup: func(e *matrixRun) { e.fillMemory("allkeys-lru") }},
		{name: "maxmemory volatile-ttl", misconfig: true, setup: func(e *matrixRun) { e.fillMemory("volatile-ttl") }},
		slowReplies,
		{name: "30% replies dropped", act: func(e *matrixRun) { e.proxy.SetDropReplies(0.3) }},
		{name: "DEBUG SLEEP 2", server: []string{"--enable-debug-command", "local"}, at: matrixMid,
			act: func(e *matrixRun) { e.do(e.direct(), "DEBUG", "SLEEP", "2") }},
		{name: "CLIENT PAUSE 1000 WRITE", at: matrixMid,
			act: func(e *matrixRun) { e.do(e.direct(), "CLIENT", "PAUSE", "1000", "WRITE") }},
		{name: "stopped 3 s, restarted empty", at: matrixMid, act: func(e *matrixRun) {
			e.proxy.Refuse(true) // a dead server refuses connections
			e.server.Stop()
			time.Sleep(3 * time.Second)
			if err := e.server.Restart(e.args...); err != nil {
				e.notes = append(e.notes, "restart: "+err.Error())
			}
			e.proxy.Refuse(false)
		}},
		{name: "TIME back 1 h (failover)", at: matrixMid,
			setup: func(e *matrixRun) {
				r := e.replica(-time.Hour)
				e.mid = func() {
					c := redis.NewClient(&redis.Options{Addr: r.Addr})
					defer c.Close()
					e.do(c, "REPLICAOF", "NO", "ONE")
					e.proxy.SetUpstream(r.Addr)
					e.proxy.ResetAll()
				}
			},
			act: func(e *matrixRun) { e.mid() }},
	}
}

// matrixSpec is what the parent tells each matrix worker, as JSON.
type matrixSpec struct {
	Addr, Password string
	Prefix, Key    string
	Limit          bucket.Limit
	FailClosed     bool
	Goroutines     int
	Start          time.Time
	Duration       time.Duration
	Out            string // where the worker writes its matrixResult
}

// matrixResult is what a worker reports.
type matrixResult struct {
	Calls, Admitted, Lost int
	Unavailable           int // lost calls that errors.Is ErrUnavailable
	FirstAdmit, LastAdmit time.Time
	SlowestWait           time.Duration // a whole bucket.Wait
	SlowestReserve        time.Duration // its call to the bucket
	Members               int64         // the fleet size the bucket knew at the end
	OnShare               int           // admissions a fail-open share made
	Opened                int           // times the breaker opened
	Errors                map[string]int
	Warmup                string // the warmup's error, if any
}

// TestFaultMatrixWorker is a matrix worker when run as one by
// TestFaultMatrix, and skips otherwise.
func TestFaultMatrixWorker(t *testing.T) {
	raw := os.Getenv(matrixWorkerEnv)
	if raw == "" {
		t.Skip("a worker process of TestFaultMatrix")
	}
	var spec matrixSpec
	require.NoError(t, json.Unmarshal([]byte(raw), &spec))
	res := matrixWork(spec)
	out, err := json.Marshal(res)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(spec.Out, out, 0o600))
}

// timedBucket is a Bucket that records its slowest Reserve.
type timedBucket struct {
	bucket.Bucket
	slowest atomic.Int64
}

func (b *timedBucket) Reserve(ctx context.Context, key string, cost bucket.Cost, maxWait time.Duration) (bucket.Reservation, error) {
	start := time.Now()
	r, err := b.Bucket.Reserve(ctx, key, cost, maxWait)
	d := int64(time.Since(start))
	for {
		old := b.slowest.Load()
		if d <= old || b.slowest.CompareAndSwap(old, d) {
			return r, err
		}
	}
}

// matrixWork saturates spec.Key with spec.Goroutines goroutines calling
// bucket.Wait from spec.Start for spec.Duration.
func matrixWork(spec matrixSpec) matrixResult {
	redis.SetLogger(quietLogger{})
	rdb := redis.NewClient(&redis.Options{Addr: spec.Addr, Password: spec.Password,
		ContextTimeoutEnabled: true, PoolSize: spec.Goroutines + 2})
	defer rdb.Close()
	var opened atomic.Int32
	opts := []bucket.Option{bucket.WithPrefix(spec.Prefix), bucket.WithRedisBreaker(gobreaker.Settings{
		OnStateChange: func(_ string, _, to gobreaker.State) {
			if to == gobreaker.StateOpen {
				opened.Add(1)
			}
		},
	})}
	if spec.FailClosed {
		opts = append(opts, bucket.WithFailClosed())
	}
	rb := bucket.NewRedis(rdb, spec.Limit, opts...)
	b := &timedBucket{Bucket: rb}
	ctx := context.Background()
	var res matrixResult
	// Connect, load the script and join the fleet before the start.
	if _, err := rb.Reserve(ctx, spec.Key+":warmup", bucket.N(1), 0); err != nil {
		res.Warmup = err.Error()
	}
	sleepUntil(spec.Start)
	end := spec.Start.Add(spec.Duration)
	// A Wait may not outlast the run by more than matrixGrace: a slot
	// further away fails at once (ErrDeadline), and counts as lost.
	ctx, cancel := context.WithDeadline(ctx, end.Add(matrixGrace))
	defer cancel()
	var mu sync.Mutex
	res.Errors = map[string]int{}
	var wg sync.WaitGroup
	for range spec.Goroutines {
		wg.Go(func() {
			var r matrixResult
			errs := map[string]int{}
			for time.Now().Before(end) {
				start := time.Now()
				rv, err := bucket.Wait(ctx, b, spec.Key, bucket.N(1))
				now := time.Now()
				r.Calls++
				r.SlowestWait = max(r.SlowestWait, now.Sub(start))
				if err != nil {
					r.Lost++
					if errors.Is(err, bucket.ErrUnavailable) {
						r.Unavailable++
					}
					errs[errorKind(err)]++
					time.Sleep(10 * time.Millisecond) // errors may come at once
					continue
				}
				r.Admitted++
				if rv.Epoch == math.MaxUint64 {
					r.OnShare++
				}
				if r.FirstAdmit.IsZero() {
					r.FirstAdmit = now
				}
				r.LastAdmit = now
			}
			mu.Lock()
			res.add(r)
			for k, v := range errs {
				res.Errors[k] += v
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	res.SlowestReserve = time.Duration(b.slowest.Load())
	res.Opened = int(opened.Load())
	res.Members = bucket.Members(rb)
	return res
}

// add adds r's counts to res, and widens its span and maxima to r's.
func (res *matrixResult) add(r matrixResult) {
	res.Calls += r.Calls
	res.Admitted += r.Admitted
	res.Lost += r.Lost
	res.Unavailable += r.Unavailable
	res.OnShare += r.OnShare
	res.Opened += r.Opened
	if !r.FirstAdmit.IsZero() && (res.FirstAdmit.IsZero() || r.FirstAdmit.Before(res.FirstAdmit)) {
		res.FirstAdmit = r.FirstAdmit
	}
	if r.LastAdmit.After(res.LastAdmit) {
		res.LastAdmit = r.LastAdmit
	}
	res.SlowestWait = max(res.SlowestWait, r.SlowestWait)
	res.SlowestReserve = max(res.SlowestReserve, r.SlowestReserve)
	res.Members = max(res.Members, r.Members)
	if res.Warmup == "" {
		res.Warmup = r.Warmup
	}
	for k, v := range r.Errors {
		if res.Errors == nil {
			res.Errors = map[string]int{}
		}
		res.Errors[k] += v
	}
}

// matrixLine is one measured row of the table.
type matrixLine struct {
	row        matrixRow
	failClosed bool
	res        matrixResult
	span       time.Duration // from the first admission to the later of the last and the run's end
	scripts    int64         // script calls the upstream ran (-1: unknown)
	dropped    int64
	notes      []string
}

func (l matrixLine) bound() float64 {
	return matrixLimit.Burst + matrixLimit.Rate*l.span.Seconds()
}

func (l matrixLine) shareBound() float64 {
	return l.bound() + matrixLimit.Burst/matrixProcs
}

func (l matrixLine) policy() string {
	if l.failClosed {
		return "fail-closed"
	}
	return "fail-open"
}

func TestFaultMatrix(t *testing.T) {
	if os.Getenv(matrixEnv) != "1" {
		t.Skip("a measurement of a few minutes: set SLUICE_FAULT_MATRIX=1 to run it")
	}
	check := os.Getenv(matrixAssertEnv) == "1"
	var lines []matrixLine
	for _, row := range matrixRows() {
		for _, closed := range []bool{false, true} {
			l := matrixLine{row: row, failClosed: closed}
			t.Run(row.name+"/"+l.policy(), func(t *testing.T) {
				l = runMatrixRow(t, l)
				lines = append(lines, l)
				t.Log(matrixTableLine(l))
				if check {
					assertMatrixLine(t, l)
				}
			})
		}
	}
	fmt.Print(matrixTable(lines))
}

// runMatrixRow runs l's row under l's policy.
func runMatrixRow(t *testing.T, l matrixLine) matrixLine {
	row := l.row
	e := &matrixRun{t: t, args: row.server, done: make(chan struct{})}
	e.server = redistest.Own(t, row.server...)
	e.proxy = redistest.NewProxy(t, e.server.Addr)
	t.Cleanup(e.end)
	if row.setup != nil {
		row.setup(e)
	}
	spec := matrixSpec{
		Addr: e.proxy.Addr, Password: e.clientPass,
		Prefix: "matrix" + strconv.FormatInt(time.Now().UnixNano(), 36), Key: "k",
		Limit: matrixLimit, FailClosed: l.failClosed, Goroutines: matrixGoroutines,
		Start: time.Now().Add(1500 * time.Millisecond), Duration: matrixDuration,
	}
	var acted sync.WaitGroup
	if row.act != nil {
		acted.Go(func() {
			sleepUntil(spec.Start.Add(row.at))
			row.act(e)
		})
	}
	results := make([]matrixResult, matrixProcs)
	errs := make([]error, matrixProcs)
	var wg sync.WaitGroup
	dir := t.TempDir()
	for i := range matrixProcs {
		s := spec
		s.Out = filepath.Join(dir, fmt.Sprintf("worker%d.json", i))
		raw, err := json.Marshal(s)
		require.NoError(t, err)
		wg.Go(func() {
			// A worker ends by the run's end and its grace; kill one that
			// hangs, so that one row cannot hold up the matrix.
			ctx, cancel := context.WithDeadline(context.Background(), spec.Start.Add(spec.Duration+matrixGrace+20*time.Second))
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestFaultMatrixWorker$")
			cmd.Env = append(os.Environ(), matrixWorkerEnv+"="+string(raw))
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				errs[i] = fmt.Errorf("%w\n%s", err, out.Bytes())
				return
			}
			b, err := os.ReadFile(s.Out)
			if err == nil {
				err = json.Unmarshal(b, &results[i])
			}
			errs[i] = err
		})
	}
	wg.Wait()
	acted.Wait()
	e.end()
	for i, err := range errs {
		require.NoError(t, err, "worker %d", i)
		l.res.add(results[i])
	}
	if !l.res.FirstAdmit.IsZero() {
		end := spec.Start.Add(spec.Duration)
		if l.res.LastAdmit.After(end) {
			end = l.res.LastAdmit
		}
		l.span = end.Sub(spec.Start)
		if d := l.res.FirstAdmit.Sub(spec.Start); d > 50*time.Millisecond {
			l.notes = append(l.notes, fmt.Sprintf("first admission recorded %v after the start", d.Round(time.Millisecond)))
		}
	}
	l.scripts = scriptsRun(t, e.proxy.Upstream(), e.pass)
	l.dropped = e.proxy.Dropped()
	l.notes = append(l.notes, e.notes...)
	return l
}

// scriptsRun returns how many scripts (EVALSHA and EVAL) the server at addr
// has run, or -1 if it cannot tell.
func scriptsRun(t *testing.T, addr, pass string) int64 {
	c := redis.NewClient(&redis.Options{Addr: addr, Password: pass, MaxRetries: -1})
	defer c.Close()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Logf("commandstats of %s: %v", addr, err)
		return -1
	}
	var n int64
	for line := range strings.SplitSeq(info, "\r\n") {
		for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
			if v, ok := strings.CutPrefix(line, cmd); ok {
				v, _, _ = strings.Cut(v, ",")
				k, err := strconv.ParseInt(v, 10, 64)
				require.NoError(t, err, line)
				n += k
			}
		}
	}
	return n
}

// assertMatrixLine holds l to invariant 11 (see the top of this file).
func assertMatrixLine(t *testing.T, l matrixLine) {
	r := l.res
	require.NotZero(t, r.Calls)
	if l.row.misconfig {
		assert.Equal(t, r.Calls, r.Lost, "every call must fail: a misconfiguration is no outage to ride out")
		assert.Zero(t, r.Unavailable, "the error must not be ErrUnavailable: no wait cures it")
	} else if !l.failClosed {
		assert.Zero(t, r.Lost, "no call lost while failing open")
	}
	assert.LessOrEqual(t, float64(r.Admitted), l.shareBound()+1,
		"admitted within Burst + Rate·T + Burst/n over T = %v", l.span)
}

const matrixHeader = "| fault | policy | calls | lost | admitted | T (s) | B+R·T | admitted/(B+R·T) | B+R·T+B/n | verdict | slowest Wait | slowest Reserve | n | scripts run | errors, notes |\n" +
	"|---|---|--:|--:|--:|--:|--:|--:|--:|:-:|--:|--:|--:|--:|---|\n"

func matrixTable(lines []matrixLine) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nFault matrix: %d processes × %d goroutines calling bucket.Wait on one key for %v, limit Rate %g/s Burst %g.\n"+
		"A goroutine whose Wait fails tries again 10 ms later; a Wait may outlast the run by %v. T runs from the start to the\n"+
		"later of the last admission and the run's end. n: the fleet size the buckets knew at the end (– none). Scripts run: by the Redis\n"+
		"the proxy points to at the end, warmups and membership beats (about one a second a process) included.\n"+
		"Verdict: masked = a misconfiguration taken for an outage; over = admitted > B+R·T+B/n+1; wedged = calls failed with an error\n"+
		"other than ErrUnavailable; lost = calls failed while failing open.\n\n",
		matrixProcs, matrixGoroutines, matrixDuration, matrixLimit.Rate, matrixLimit.Burst, matrixGrace)
	b.WriteString(matrixHeader)
	for _, l := range lines {
		b.WriteString(matrixTableLine(l))
		b.WriteString("\n")
	}
	return b.String()
}

func matrixTableLine(l matrixLine) string {
	r := l.res
	verdict := "ok"
	switch {
	case l.row.misconfig && (r.Lost != r.Calls || r.Unavailable > 0):
		verdict = "**masked**" // a misconfiguration taken for an outage
	case float64(r.Admitted) > l.shareBound()+1:
		verdict = "**over**"
	case !l.row.misconfig && r.Lost > r.Unavailable:
		verdict = "**wedged**" // calls failed with what no failure policy explains
	case !l.row.misconfig && !l.failClosed && r.Lost > 0:
		verdict = "**lost**"
	}
	var notes []string
	if r.Warmup != "" {
		notes = append(notes, "warmup: "+short(r.Warmup))
	}
	// The most frequent errors first.
	msgs := slices.SortedFunc(maps.Keys(r.Errors), func(a, b string) int { return r.Errors[b] - r.Errors[a] })
	for i, m := range msgs {
		if i == 2 {
			notes = append(notes, fmt.Sprintf("+%d more", len(msgs)-2))
			break
		}
		notes = append(notes, fmt.Sprintf("%d× %s", r.Errors[m], short(m)))
	}
	if l.dropped > 0 {
		notes = append(notes, fmt.Sprintf("%d replies dropped", l.dropped))
	}
	if r.OnShare > 0 || r.Opened > 0 {
		notes = append(notes, fmt.Sprintf("%d admitted on shares, breakers opened %d times", r.OnShare, r.Opened))
	}
	notes = append(notes, l.notes...)
	ratio := 0.0
	if l.bound() > 0 {
		ratio = float64(r.Admitted) / l.bound()
	}
	n := "–" // a bucket failing closed does not count its fleet
	if r.Members > 0 {
		n = strconv.FormatInt(r.Members, 10)
	}
	return fmt.Sprintf("| %s | %s | %d | %d | %d | %.2f | %.0f | %.2f | %.0f | %s | %v | %v | %s | %d | %s |",
		l.row.name, l.policy(), r.Calls, r.Lost, r.Admitted, l.span.Seconds(), l.bound(), ratio, l.shareBound(), verdict,
		r.SlowestWait.Round(time.Millisecond), r.SlowestReserve.Round(time.Millisecond), n, l.scripts,
		strings.ReplaceAll(strings.Join(notes, "; "), "|", "/"))
}

// number matches the numbers and durations in an error message.
var number = regexp.MustCompile(`(\d+(\.\d+)?(ns|µs|ms|h|m|s)?)+`)

// errorKind is err's message with its numbers replaced by N, to count
// errors of one kind together.
func errorKind(err error) string { return number.ReplaceAllString(err.Error(), "N") }

// short trims an error message for the table.
func short(s string) string {
	s = strings.TrimPrefix(s, "bucket: redis reserve: ")
	s = strings.TrimPrefix(s, "bucket: redis unavailable: ")
	if r := []rune(s); len(r) > 60 {
		s = string(r[:60]) + "…"
	}
	return s
}
