package bucket_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// fakeRedis is a TCP server that speaks just enough RESP for go-redis: it
// turns down HELLO and CLIENT (so the client settles for RESP2 without
// them), answers PING, and answers every other command with reply, a RESP
// line such as "-LOADING ...", or never if reply is empty.
type fakeRedis struct {
	addr     string
	reply    string
	commands atomic.Int32 // commands other than HELLO, CLIENT and PING
}

func startFakeRedis(t *testing.T, reply string) *fakeRedis {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fakeRedis{addr: l.Addr().String(), reply: reply}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { f.serve(c) })
		}
	})
	return f
}

func (f *fakeRedis) serve(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		args, err := readCommand(r)
		if err != nil {
			return
		}
		var out string
		switch strings.ToUpper(args[0]) {
		case "HELLO", "CLIENT":
			out = "-ERR unknown command\r\n"
		case "PING":
			out = "+PONG\r\n"
		default:
			f.commands.Add(1)
			if f.reply == "" {
				continue
			}
			out = f.reply + "\r\n"
		}
		if _, err := io.WriteString(c, out); err != nil {
			return
		}
	}
}

// readCommand reads one RESP array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "*")))
	if err != nil || n < 1 {
		return nil, errors.New("fake redis: not an array")
	}
	args := make([]string, n)
	for i := range args {
		if line, err = r.ReadString('\n'); err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
		if err != nil {
			return nil, err
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		args[i] = string(b[:size])
	}
	return args, nil
}

// verifyNoLeaks checks, once t and its cleanups are done, that no goroutine
// started since is left.
func verifyNoLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// fastClient is a client set up as WithRedisTimeout advises: its reads and
// writes honour the context's deadline.
func fastClient(t *testing.T, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// TestRedisFailureClassification: the error replies of a Redis that cannot
// serve are failures (fail closed: *UnavailableError; fail open: the share
// bucket admits), and those of a working Redis are returned as they are.
func TestRedisFailureClassification(t *testing.T) {
	for _, tc := range []struct {
		reply   string
		failure bool
	}{
		{"-LOADING Redis is loading the dataset in memory", true},
		{"-READONLY You can't write against a read only replica.", true},
		{"-CLUSTERDOWN The cluster is down", true},
		{"-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", true},
		{"-TRYAGAIN Multiple keys request during rehashing of slot", true},
		{"-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", true},
		{"-OOM command not allowed when used memory > 'maxmemory'.", true},
		{"-NOREPLICAS Not enough good replicas to write.", true},
		{"-ERR max number of clients reached", true},
		{"-NOAUTH Authentication required.", true},
		{"-WRONGPASS invalid username-password pair or user is disabled.", true},
		{"-ERR Error running script (call to f_0): @user_script:1: boom", false},
		{"-WRONGTYPE Operation against a key holding the wrong kind of value", false},
		{"-NOPERM this user has no permissions to run the 'evalsha' command", false},
		{"-CROSSSLOT Keys in request don't hash to the same slot", false},
	} {
		name, _, _ := strings.Cut(tc.reply[1:], " ")
		t.Run(name, func(t *testing.T) {
			rdb := fastClient(t, startFakeRedis(t, tc.reply).addr)
			want := tc.reply[1:]

			closed := bucket.NewRedis(rdb, bucket.PerSecond(10), bucket.WithFailClosed())
			r, err := closed.Reserve(t.Context(), "k", bucket.N(1), 0)
			require.Error(t, err)
			assert.False(t, r.OK)
			assert.ErrorContains(t, err, want)
			var ue *bucket.UnavailableError
			assert.Equal(t, tc.failure, errors.As(err, &ue), "%v", err)
			assert.Equal(t, tc.failure, errors.Is(err, bucket.ErrUnavailable))

			open := bucket.NewRedis(rdb, bucket.PerSecond(10))
			r, err = open.Reserve(t.Context(), "k", bucket.N(1), 0)
			if tc.failure {
				assert.NoError(t, err)
				assert.True(t, r.OK, "admitted by this process's share")
			} else {
				assert.ErrorContains(t, err, want)
				assert.False(t, r.OK)
			}
		})
	}
}

// stateLog records a breaker's state changes.
type stateLog struct {
	mu     sync.Mutex
	log    []string
	closed time.Time // the last change to closed
}

func (s *stateLog) record(_ string, from, to gobreaker.State) {
	s.mu.Lock()
	s.log = append(s.log, from.String()+">"+to.String())
	if to == gobreaker.StateClosed {
		s.closed = time.Now()
	}
	s.mu.Unlock()
}

// closedSince returns how long after t the breaker last closed, or -1.
func (s *stateLog) closedSince(t time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Before(t) {
		return -1
	}
	return s.closed.Sub(t)
}

func (s *stateLog) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.log...)
}

// TestBreakerBoundsOutageCost: against a Redis that never answers, the
// first call costs one Redis timeout, the calls after it none, and one call
// per breaker period probes again, the others not waiting for it.
func TestBreakerBoundsOutageCost(t *testing.T) {
	verifyNoLeaks(t)
	fake := startFakeRedis(t, "")
	const timeout, period = 50 * time.Millisecond, 300 * time.Millisecond
	var states stateLog
	b := bucket.NewRedis(fastClient(t, fake.addr), bucket.PerSecond(1000),
		bucket.WithRedisTimeout(timeout),
		bucket.WithRedisBreaker(gobreaker.Settings{Timeout: period, OnStateChange: states.record}))
	ctx := t.Context()
	reserve := func() time.Duration {
		start := time.Now()
		r, err := b.Reserve(ctx, "k", bucket.N(1), 0)
		assert.NoError(t, err)
		assert.True(t, r.OK)
		return time.Since(start)
	}

	first := reserve()
	assert.GreaterOrEqual(t, first, timeout)
	assert.Less(t, first, timeout+40*time.Millisecond)
	assert.Equal(t, []string{"closed>open"}, states.get())

	start := time.Now()
	for range 200 {
		reserve()
	}
	assert.Less(t, time.Since(start), timeout, "200 calls while open cost less than one timeout together")
	assert.Equal(t, int32(1), fake.commands.Load(), "nothing sent while the breaker is open")

	time.Sleep(period)
	probe := make(chan time.Duration)
	go func() { probe <- reserve() }()
	require.Eventually(t, func() bool { return fake.commands.Load() == 2 }, time.Second, time.Millisecond)
	assert.Less(t, reserve(), timeout/2, "the probe's peers do not wait for it")
	assert.GreaterOrEqual(t, <-probe, timeout)
	assert.Equal(t, int32(2), fake.commands.Load())
	assert.Equal(t, []string{"closed>open", "open>half-open", "half-open>open"}, states.get())
}

// TestCallerContextIsNotARedisFailure: a call whose own context ends first
// returns the context's error: no fallback, no breaker trip, nothing sent
// for a context that had already ended.
func TestCallerContextIsNotARedisFailure(t *testing.T) {
	verifyNoLeaks(t)
	fake := startFakeRedis(t, "")
	var states stateLog
	b := bucket.NewRedis(fastClient(t, fake.addr), bucket.PerSecond(10), bucket.WithRedisTimeout(time.Second),
		bucket.WithRedisBreaker(gobreaker.Settings{OnStateChange: states.record}))

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	defer cancel()
	r, err := b.Reserve(ctx, "k", bucket.N(1), 0)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotErrorIs(t, err, bucket.ErrUnavailable)
	assert.False(t, r.OK, "not admitted by the fallback")
	assert.ErrorIs(t, b.Adjust(ctx, "k", bucket.N(-1)), context.DeadlineExceeded)
	assert.ErrorIs(t, b.Observe(ctx, "k", adaptive.Feedback{RetryAfter: time.Second}), context.DeadlineExceeded)

	cctx, cancel := context.WithCancel(t.Context())
	cancel()
	sent := fake.commands.Load()
	_, err = b.Reserve(cctx, "k", bucket.N(1), 0)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, sent, fake.commands.Load(), "a done context sends nothing")
	assert.Empty(t, states.get(), "the breaker never tripped")
}

// TestFailClosed: with Redis gone, every method fails with an
// *UnavailableError that wraps the cause: Redis's error, then the open
// breaker's.
func TestFailClosed(t *testing.T) {
	srv := redistest.Own(t)
	rdb := fastClient(t, srv.Addr)
	b := bucket.NewRedis(rdb, bucket.PerSecond(10), bucket.WithFailClosed())
	ctx := t.Context()
	r, err := b.Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	require.True(t, r.OK)
	srv.Stop()

	r, err = b.Reserve(ctx, "k", bucket.N(1), 0)
	assert.False(t, r.OK)
	var ue *bucket.UnavailableError
	require.ErrorAs(t, err, &ue)
	// go-redis retries the dial until the Redis timeout ends the call.
	assert.ErrorIs(t, ue.Err, context.DeadlineExceeded)
	assert.Equal(t, "bucket: redis reserve: bucket: redis unavailable: "+ue.Err.Error(), err.Error())

	for name, err := range map[string]error{
		"reserve": func() error { _, err := b.Reserve(ctx, "k", bucket.N(1), time.Hour); return err }(),
		"wait":    func() error { _, err := bucket.Wait(ctx, b, "k", bucket.N(1)); return err }(),
		"adjust":  b.Adjust(ctx, "k", bucket.N(-1)),
		"observe": b.Observe(ctx, "k", adaptive.Feedback{Class: adaptive.RateLimited}),
		"tokens":  func() error { _, err := b.Tokens(ctx, "k"); return err }(),
	} {
		assert.ErrorIs(t, err, bucket.ErrUnavailable, name)
		assert.ErrorIs(t, err, gobreaker.ErrOpenState, "%s: the breaker answers, not Redis", name)
	}
}

// TestFailOpen: with Redis gone, a member of a fleet of two takes its share
// (half of every limit) from a local bucket, Observe included, and goes
// back to Redis once the breaker's probe finds it back.
func TestFailOpen(t *testing.T) {
	srv := redistest.Own(t)
	rdb := fastClient(t, srv.Addr)
	clk := &fakeClock{t: time.Now()} // the share bucket's time
	lim := bucket.Limit{Rate: 10, Burst: 10}
	var states stateLog
	opts := []bucket.Option{bucket.WithClock(clk), bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 100, Burst: 100}),
		bucket.WithRedisBreaker(gobreaker.Settings{Timeout: 100 * time.Millisecond, OnStateChange: states.record})}
	a := bucket.NewRedis(rdb, lim, append(opts, bucket.WithMemberID("a"))...)
	b := bucket.NewRedis(rdb, lim, append(opts, bucket.WithMemberID("b"))...)
	ctx := t.Context()
	reserve := func(key string, cost bucket.Cost, maxWait time.Duration) bucket.Reservation {
		t.Helper()
		r, err := a.Reserve(ctx, key, cost, maxWait)
		require.NoError(t, err)
		return r
	}
	reserve("warm", bucket.N(1), 0)
	_, err := b.Reserve(ctx, "warm", bucket.N(1), 0)
	require.NoError(t, err)
	assert.Equal(t, int64(1), bucket.Members(a), "a counted itself alone")
	assert.Equal(t, int64(2), bucket.Members(b))
	clk.Advance(time.Second) // a's next count is due
	reserve("warm", bucket.N(1), 0)
	require.Equal(t, int64(2), bucket.Members(a))

	srv.Stop()
	// Bad input is no Redis failure: it fails as ever.
	_, err = a.Reserve(ctx, "k", bucket.N(11), 0)
	assert.ErrorIs(t, err, bucket.ErrExceedsBurst)
	_, err = a.Reserve(ctx, "", bucket.N(1), 0)
	assert.ErrorIs(t, err, bucket.ErrInvalidKey)
	assert.Empty(t, states.get(), "nothing sent")
	// The share: 5 requests/s, burst 5; 50 tokens/s, burst 50.
	for range 5 {
		assert.Equal(t, bucket.Reservation{OK: true}, reserve("k", bucket.N(1), 0))
	}
	assert.Equal(t, []string{"closed>open"}, states.get())
	assert.Equal(t, bucket.Reservation{RetryAfter: 200 * time.Millisecond}, reserve("k", bucket.N(1), 0))
	assert.Equal(t, bucket.Reservation{OK: true, Delay: 200 * time.Millisecond}, reserve("k", bucket.N(1), time.Second))
	require.NoError(t, a.Adjust(ctx, "k", bucket.N(-1)), "the refund goes to the share too")
	assert.Equal(t, bucket.Reservation{OK: true, Delay: 200 * time.Millisecond}, reserve("k", bucket.N(1), time.Second))

	// A cost within the limit but beyond the share's burst: taken once the
	// share is full, the excess owed.
	assert.Equal(t, bucket.Reservation{OK: true}, reserve("big", bucket.Cost{bucket.Requests: 1, bucket.Tokens: 80}, 0))
	assert.Equal(t, bucket.Reservation{OK: true, Delay: 620 * time.Millisecond},
		reserve("big", bucket.Cost{bucket.Requests: 1, bucket.Tokens: 1}, time.Second), "(1 + 30) tokens at 50/s")

	// Observe holds the share back too.
	require.NoError(t, a.Observe(ctx, "paused", adaptive.Feedback{Class: adaptive.RateLimited, RetryAfter: 3 * time.Second}))
	r := reserve("paused", bucket.N(1), time.Minute)
	assert.GreaterOrEqual(t, r.Delay, 3*time.Second)

	_, err = a.Tokens(ctx, "k")
	assert.ErrorIs(t, err, bucket.ErrUnavailable, "Tokens reads Redis only")

	require.NoError(t, srv.Restart())
	require.Eventually(t, func() bool {
		reserve("k", bucket.N(1), time.Second)
		return len(states.get()) >= 3 && states.get()[len(states.get())-1] == "half-open>closed"
	}, 2*time.Second, 10*time.Millisecond)
	tk, err := a.Tokens(ctx, "k")
	require.NoError(t, err)
	assert.InDelta(t, 9, tk[bucket.Requests], 0.5, "back on Redis, which lost the key: full, less the last call")
}

// TestFleetMembers pins the membership set on miniredis: one sorted set per
// prefix, a member per process scored by Redis TIME, members silent for
// 10 s dropped, the set gone 10 s after the last beat; buckets that fail
// closed are not members.
func TestFleetMembers(t *testing.T) {
	mr := miniredis.RunT(t)
	now := epoch
	mr.SetTime(now)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	clk := &fakeClock{t: epoch}
	advance := func(d time.Duration) {
		now = now.Add(d)
		mr.SetTime(now)
		clk.Advance(d)
	}
	ctx := t.Context()
	var members []bucket.Bucket
	for _, id := range []string{"a", "b", "c"} {
		members = append(members, bucket.NewRedis(rdb, bucket.PerSecond(10), bucket.WithPrefix("p"),
			bucket.WithClock(clk), bucket.WithMemberID(id)))
	}
	closed := bucket.NewFixedWindow(rdb, bucket.PerSecond(10), bucket.WithPrefix("p"), bucket.WithFailClosed())
	for _, b := range append(members, closed) {
		_, err := b.Reserve(ctx, "k", bucket.N(1), 0)
		require.NoError(t, err)
	}
	assert.Equal(t, []int64{1, 2, 3, 0}, []int64{bucket.Members(members[0]), bucket.Members(members[1]),
		bucket.Members(members[2]), bucket.Members(closed)})
	z, err := rdb.ZRangeWithScores(ctx, "p:members", 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, z, 3)
	assert.Equal(t, float64(epoch.UnixMicro()), z[0].Score, "scored by Redis TIME in µs")
	assert.Equal(t, 10*time.Second, mr.TTL("p:members"))

	advance(500 * time.Millisecond) // not due: no beat
	_, err = members[0].Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	assert.Equal(t, int64(1), bucket.Members(members[0]))

	advance(5500 * time.Millisecond)
	_, err = members[0].Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	assert.Equal(t, int64(3), bucket.Members(members[0]))
	advance(5 * time.Second) // b and c silent for 11 s
	_, err = members[0].Reserve(ctx, "k", bucket.N(1), 0)
	require.NoError(t, err)
	assert.Equal(t, int64(1), bucket.Members(members[0]))
	assert.Equal(t, []string{"a"}, rdb.ZRange(ctx, "p:members", 0, -1).Val())

	mr.FastForward(10 * time.Second)
	assert.False(t, mr.Exists("p:members"))
}

// TestRedisRestartLosesState: a Redis restarted without its data gives a
// drained bucket back full. Over a saturated run with such a restart, the
// fleet (one process here) is admitted at most Burst + Rate·T plus one
// burst failing closed (Redis's, full again), plus two failing open (the
// share bucket also starts full).
func TestRedisRestartLosesState(t *testing.T) {
	srv := redistest.Own(t)
	rdb := fastClient(t, srv.Addr)
	lim := bucket.Limit{Rate: 50, Burst: 50}
	ctx := t.Context()
	for _, tc := range []struct {
		name   string
		opt    bucket.Option
		bursts float64
	}{
		{"fail closed", bucket.WithFailClosed(), 1},
		{"fail open", bucket.WithFailOpen(), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := bucket.NewRedis(rdb, lim, tc.opt, bucket.WithPrefix(strings.ReplaceAll(tc.name, " ", "-")))
			r, err := b.Reserve(ctx, "drained", bucket.N(lim.Burst), 0)
			require.NoError(t, err)
			require.True(t, r.OK)

			var admitted, failed atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			end := start.Add(1500 * time.Millisecond)
			for range 4 {
				wg.Go(func() {
					for time.Now().Before(end) {
						r, err := b.Reserve(ctx, "hot", bucket.N(1), 0)
						switch {
						case err != nil:
							assert.ErrorIs(t, err, bucket.ErrUnavailable)
							failed.Add(1)
							time.Sleep(10 * time.Millisecond)
						case r.OK:
							admitted.Add(1)
						default:
							time.Sleep(r.RetryAfter)
						}
					}
				})
			}
			time.Sleep(300 * time.Millisecond)
			srv.Stop()
			require.NoError(t, srv.Restart())
			wg.Wait()
			span := time.Since(start)

			tk, err := b.Tokens(ctx, "drained")
			require.NoError(t, err)
			assert.Equal(t, lim.Burst, tk[bucket.Requests], "the drained bucket is full again")
			normal := lim.Burst + lim.Rate*span.Seconds()
			over := float64(admitted.Load()) - normal
			t.Logf("%s: admitted %d in %v across a restart, Burst + Rate·T %.1f: overshoot %.0f (%.2f bursts; bound %g); %d calls failed",
				tc.name, admitted.Load(), span.Round(time.Millisecond), normal, over, over/lim.Burst, tc.bursts, failed.Load())
			assert.LessOrEqual(t, over, tc.bursts*lim.Burst+1)
			if tc.name == "fail open" {
				assert.Zero(t, failed.Load())
			}
		})
	}
}

// TestRedisHangs: a Redis that stops answering (SIGSTOP) costs a call at
// most one Redis timeout, with a client that honours context deadlines;
// failing open, no call fails, and calls go back to Redis once it answers.
func TestRedisHangs(t *testing.T) {
	srv := redistest.Own(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	const timeout = 250 * time.Millisecond // the default
	var states stateLog
	b := bucket.NewRedis(rdb, bucket.Limit{Rate: 1000, Burst: 100},
		bucket.WithRedisBreaker(gobreaker.Settings{OnStateChange: states.record}))
	ctx := t.Context()

	var (
		mu            sync.Mutex
		slowest       time.Duration
		calls, failed int
	)
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(2500 * time.Millisecond)
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(end) {
				st := time.Now()
				r, err := b.Reserve(ctx, "hang", bucket.N(1), time.Second)
				d := time.Since(st)
				mu.Lock()
				calls++
				slowest = max(slowest, d)
				if err != nil {
					failed++
				}
				mu.Unlock()
				time.Sleep(r.Delay)
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, srv.Pause())
	time.Sleep(time.Second)
	resumed := time.Now()
	require.NoError(t, srv.Resume())
	wg.Wait()

	back := states.closedSince(resumed)
	t.Logf("Redis paused 1 s: %d calls, %d failed, slowest Reserve %v (Redis timeout %v); back on Redis %v after it resumed; breaker %v",
		calls, failed, slowest.Round(time.Millisecond), timeout, back.Round(time.Millisecond), states.get())
	assert.Zero(t, failed)
	assert.Less(t, slowest, timeout+100*time.Millisecond, "no call pays more than one timeout")
	assert.GreaterOrEqual(t, back, time.Duration(0), "back on Redis")
	assert.Less(t, back, time.Second)
}
