package bucket_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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
	reply    atomic.Pointer[string] // set it to change the answer
	commands atomic.Int32           // commands other than HELLO, CLIENT and PING
}

func startFakeRedis(t *testing.T, reply string) *fakeRedis {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fakeRedis{addr: l.Addr().String()}
	f.reply.Store(&reply)
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
			reply := *f.reply.Load()
			if reply == "" {
				continue
			}
			out = reply + "\r\n"
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
	const (
		failure = iota // Redis cannot serve now: fail open or closed
		config         // no wait cures it: a *ConfigError, whatever the policy
		bug            // a working Redis's reply: returned as it is
	)
	for _, tc := range []struct {
		reply string
		kind  int
	}{
		{"-LOADING Redis is loading the dataset in memory", failure},
		{"-CLUSTERDOWN The cluster is down", failure},
		{"-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", failure},
		{"-TRYAGAIN Multiple keys request during rehashing of slot", failure},
		{"-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", failure},
		{"-OOM command not allowed when used memory > 'maxmemory'.", failure},
		{"-NOREPLICAS Not enough good replicas to write.", failure},
		{"-ERR max number of clients reached", failure},
		{"-READONLY You can't write against a read only replica.", config}, // at first contact
		{"-NOAUTH Authentication required.", config},
		{"-WRONGPASS invalid username-password pair or user is disabled.", config},
		{"-NOPERM this user has no permissions to run the 'evalsha' command", config},
		{"-ERR unknown command 'EVALSHA', with args beginning with:", config},
		{"-ERR Error running script (call to f_0): @user_script:1: boom", bug},
		{"-WRONGTYPE Operation against a key holding the wrong kind of value", bug},
		{"-CROSSSLOT Keys in request don't hash to the same slot", bug},
	} {
		name, _, _ := strings.Cut(tc.reply[1:], " ")
		if name == "ERR" {
			name = tc.reply[5:15]
		}
		t.Run(name, func(t *testing.T) {
			rdb := fastClient(t, startFakeRedis(t, tc.reply).addr)
			want := tc.reply[1:]

			closed := bucket.NewRedis(rdb, bucket.PerSecond(10), bucket.WithFailClosed())
			r, err := closed.Reserve(t.Context(), "k", bucket.N(1), 0)
			require.Error(t, err)
			assert.False(t, r.OK)
			assert.ErrorContains(t, err, want)
			assert.Equal(t, tc.kind == failure, errors.Is(err, bucket.ErrUnavailable), "%v", err)
			assert.Equal(t, tc.kind == config, errors.Is(err, bucket.ErrMisconfigured), "%v", err)
			var ce *bucket.ConfigError
			if errors.As(err, &ce) {
				assert.Equal(t, fastClientAddr(rdb), ce.Addr)
			}

			open := bucket.NewRedis(rdb, bucket.PerSecond(10))
			r, err = open.Reserve(t.Context(), "k", bucket.N(1), time.Second)
			if tc.kind == failure {
				assert.NoError(t, err)
				assert.True(t, r.OK, "admitted by this process's share")
				assert.LessOrEqual(t, r.Delay, 100*time.Millisecond, "which starts empty")
			} else {
				assert.ErrorContains(t, err, want)
				assert.Equal(t, tc.kind == config, errors.Is(err, bucket.ErrMisconfigured), "%v", err)
				assert.False(t, r.OK)
			}
		})
	}
}

func fastClientAddr(rdb *redis.Client) string { return rdb.Options().Addr }

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
	// The period is long enough that the 200 calls run while the breaker
	// is open, on a loaded machine too: at 300 ms, with two hogs and
	// another package's tests running, it went half-open before they
	// began, and their probe took a contact's 5 s.
	const timeout, period, contact = 50 * time.Millisecond, 2 * time.Second, 5 * time.Second
	var states stateLog
	b := bucket.NewRedis(fastClient(t, fake.addr), bucket.PerSecond(1000),
		bucket.WithRedisTimeout(timeout),
		bucket.WithRedisBreaker(gobreaker.Settings{Timeout: period, OnStateChange: states.record}))
	ctx := t.Context()
	reserve := func() time.Duration {
		start := time.Now()
		r, err := b.Reserve(ctx, "k", bucket.N(1), bucket.Unlimited) // the share starts empty
		assert.NoError(t, err)
		assert.True(t, r.OK)
		return time.Since(start)
	}

	// The first contact is not cut by the call timeout: a slow Redis is
	// not a dead one.
	first := reserve()
	assert.GreaterOrEqual(t, first, contact)
	assert.Less(t, first, contact+time.Second, "one contact's bound, not two (a loaded machine adds its delays)")
	assert.Equal(t, []string{"closed>open"}, states.get())
	perContact := fake.commands.Load()
	require.Positive(t, perContact)

	start := time.Now()
	for range 200 {
		reserve()
	}
	assert.Less(t, time.Since(start), timeout, "200 calls while open cost less than one timeout together")
	assert.Equal(t, perContact, fake.commands.Load(), "nothing sent while the breaker is open")

	time.Sleep(period)
	probe := make(chan time.Duration)
	go func() { probe <- reserve() }()
	require.Eventually(t, func() bool { return fake.commands.Load() == 2*perContact }, time.Second, time.Millisecond)
	assert.Less(t, reserve(), timeout/2, "the probe's peers do not wait for it")
	assert.GreaterOrEqual(t, <-probe, contact)
	assert.Equal(t, 2*perContact, fake.commands.Load())
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
	assert.Equal(t, "bucket: redis reserve: bucket: redis at "+srv.Addr+" unavailable: "+ue.Err.Error(), err.Error())

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
	var outage uint64 // the Epoch of the share's reservations
	reserve := func(key string, cost bucket.Cost, maxWait time.Duration) bucket.Reservation {
		t.Helper()
		r, err := a.Reserve(ctx, key, cost, maxWait)
		require.NoError(t, err)
		if r.Epoch > 1<<32 {
			outage, r.Epoch = r.Epoch, 0
		}
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
	// The share: 5 requests/s, burst 5; 50 tokens/s, burst 50; empty at
	// first, since what the fleet had left is not known.
	assert.Equal(t, bucket.Reservation{RetryAfter: 200 * time.Millisecond}, reserve("k", bucket.N(1), 0))
	assert.Equal(t, []string{"closed>open"}, states.get())
	assert.Equal(t, bucket.Reservation{OK: true, Delay: 200 * time.Millisecond}, reserve("k", bucket.N(1), time.Second))
	require.NoError(t, a.Adjust(ctx, "k", bucket.N(-1)), "the refund goes to the share too")
	assert.Equal(t, bucket.Reservation{OK: true, Delay: 200 * time.Millisecond}, reserve("k", bucket.N(1), time.Second))
	clk.Advance(time.Second)
	for range 4 {
		assert.Equal(t, bucket.Reservation{OK: true}, reserve("k", bucket.N(1), 0))
	}

	// A cost within the limit but beyond the share's burst: taken once the
	// share holds its burst, the excess owed.
	assert.Equal(t, bucket.Reservation{OK: true, Delay: time.Second},
		reserve("big", bucket.Cost{bucket.Requests: 1, bucket.Tokens: 80}, 2*time.Second), "50 tokens at 50/s")
	assert.Equal(t, bucket.Reservation{OK: true, Delay: 1620 * time.Millisecond},
		reserve("big", bucket.Cost{bucket.Requests: 1, bucket.Tokens: 1}, 2*time.Second), "(50 + 30 + 1) tokens at 50/s")

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
	// Back on Redis, which lost the key: it starts cold, not full, and is
	// charged what the share admitted, what came due at most a burst.
	assert.LessOrEqual(t, tk[bucket.Requests], -1.0)
	assert.GreaterOrEqual(t, tk[bucket.Requests], -30.0)

	// 429s of requests the share admitted are the outage's overshoot: they
	// pause the key but do not cut Redis's rate.
	require.NotZero(t, outage)
	for range 5 {
		require.NoError(t, a.Observe(ctx, "k", adaptive.Feedback{Class: adaptive.RateLimited, Epoch: outage}))
	}
	r, err = a.Reserve(ctx, "k", bucket.N(1), time.Minute)
	require.NoError(t, err)
	assert.Zero(t, r.Epoch, "no decrease")
}

// TestFleetMembers pins the membership set under controlled time: one
// sorted set per prefix, a member per process scored by Redis TIME,
// members silent for 10 s dropped, the set gone 10 s after the last beat;
// buckets that fail closed are not members.
func TestFleetMembers(t *testing.T) {
	srv := newClockedRedis(t, epoch)
	rdb := srv.rdb
	clk := &fakeClock{t: epoch}
	advance := func(d time.Duration) {
		srv.clock.Advance(d)
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
	assert.Equal(t, 10*time.Second, srv.TTL("p:members"))

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

	// Redis deletes a key a millisecond past its expiry.
	srv.clock.Advance(10*time.Second + time.Millisecond)
	assert.False(t, srv.Exists("p:members"))
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

// TestStalledRedisBoundsUncancelledCalls: a call whose context is never
// cancelled (context.Background), which shares its deadline with other
// calls (see WithRedisTimeout), is held by a Redis that stops answering
// for one Redis timeout at most: on its connection's read, with a client
// that honours context deadlines, and while it waits for a connection of
// a pool that something else holds (go-redis waits there until the
// context is done, or its PoolTimeout, 4 s by default).
func TestStalledRedisBoundsUncancelledCalls(t *testing.T) {
	const timeout = 100 * time.Millisecond
	ctx := context.Background()
	warm := func(t *testing.T, b *bucket.Redis) {
		t.Helper()
		for range 50 { // the latency the timeout stretches to falls back from the first contact's
			_, err := b.Reserve(ctx, "k", bucket.N(1), 0)
			require.NoError(t, err)
		}
	}
	call := func(t *testing.T, b *bucket.Redis) {
		t.Helper()
		start := time.Now()
		_, err := b.Reserve(ctx, "k", bucket.N(1), 0)
		took := time.Since(start)
		t.Logf("took %v: %v", took.Round(time.Millisecond), err)
		assert.ErrorIs(t, err, bucket.ErrUnavailable)
		assert.Less(t, took, timeout+150*time.Millisecond, "one Redis timeout at most")
	}

	t.Run("read", func(t *testing.T) {
		p := redistest.NewProxy(t, redistest.Addr(t))
		rdb := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { rdb.Close() })
		b := bucket.NewRedis(rdb, bucket.PerSecond(1e6), bucket.WithFailClosed(),
			bucket.WithRedisTimeout(timeout), bucket.WithPrefix(fmt.Sprintf("stall%d", time.Now().UnixNano())))
		warm(t, b)
		p.SetLatency(time.Hour) // Redis stops answering
		call(t, b)
	})

	t.Run("pool", func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 1})
		t.Cleanup(func() { rdb.Close() })
		b := bucket.NewRedis(rdb, bucket.PerSecond(1e6), bucket.WithFailClosed(),
			bucket.WithRedisTimeout(timeout), bucket.WithPrefix(fmt.Sprintf("stall%d", time.Now().UnixNano())))
		warm(t, b)
		held := rdb.Conn() // the pool's one connection, until it is closed
		require.NoError(t, held.Ping(ctx).Err())
		defer held.Close()
		call(t, b)
	})
}

// TestShortArrayReplyIsAnError: a reserve reply that is an array of fewer
// than two elements (a proxy's, a server's bug) is an error, not a panic:
// reservation read v[0] and v[1] before it checked the length.
func TestShortArrayReplyIsAnError(t *testing.T) {
	for _, reply := range []string{"*0", "*1\r\n:5"} {
		t.Run(reply[:2], func(t *testing.T) {
			fake := startFakeRedis(t, ":0") // the first contact, then a reservation
			b := bucket.NewRedis(fastClient(t, fake.addr), bucket.PerSecond(10), bucket.WithEvictionAllowed(), bucket.WithFailClosed())
			_, err := b.Reserve(t.Context(), "k", bucket.N(1), time.Second)
			require.NoError(t, err)
			fake.reply.Store(&reply)
			require.NotPanics(t, func() { _, err = b.Reserve(t.Context(), "k", bucket.N(1), time.Second) })
			assert.ErrorContains(t, err, "unexpected reply")
		})
	}
}
