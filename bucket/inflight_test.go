package bucket_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// flightBackend is a Semaphore under test, with what a test reads of it.
type flightBackend struct {
	name   string
	new    func(t *testing.T, n int) bucket.Semaphore
	held   func(t *testing.T, s bucket.Semaphore, key string) int
	queued func(t *testing.T, s bucket.Semaphore, key string) int
}

// flightBackends are LocalInFlight and InFlight on the package's Redis, with
// a lease of a second.
func flightBackends(t *testing.T) []flightBackend {
	rdb := redistest.Client(t)
	return []flightBackend{{
		name: "local",
		new:  func(_ *testing.T, n int) bucket.Semaphore { return bucket.NewLocalInFlight(n) },
		held: func(_ *testing.T, s bucket.Semaphore, key string) int { return s.(*bucket.LocalInFlight).Held(key) },
		queued: func(_ *testing.T, s bucket.Semaphore, key string) int {
			return s.(*bucket.LocalInFlight).Queued(key)
		},
	}, {
		name: "redis",
		new: func(_ *testing.T, n int) bucket.Semaphore {
			return bucket.NewInFlight(rdb, n, bucket.WithLease(time.Second))
		},
		held: func(t *testing.T, s bucket.Semaphore, key string) int {
			n, err := s.(*bucket.InFlight).Held(t.Context(), key)
			require.NoError(t, err)
			return n
		},
		queued: func(t *testing.T, _ bucket.Semaphore, key string) int {
			return int(rdb.ZCard(t.Context(), "sluice:{"+key+"}/inflight/queue").Val())
		},
	}}
}

// flightKey is a key of its own for each test run.
func flightKey(t *testing.T) string {
	return fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
}

// TestInFlightMisconfiguration: a limit or a lease out of bounds, a Ring,
// and an option the constructor cannot honour panic at construction,
// saying what is wrong; an empty key is an error.
func TestInFlightMisconfiguration(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // constructors make no call
	t.Cleanup(func() { rdb.Close() })
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { ring.Close() })
	for _, tc := range []struct {
		name, panic string
		f           func()
	}{
		{"n 0", "bucket: NewInFlight(n = 0): n is between 1 and 1048576", func() { bucket.NewInFlight(rdb, 0) }},
		{"n negative", "bucket: NewInFlight(n = -3): n is between 1 and 1048576", func() { bucket.NewInFlight(rdb, -3) }},
		{"n huge", "bucket: NewInFlight(n = 1048577): n is between 1 and 1048576", func() { bucket.NewInFlight(rdb, 1<<20+1) }},
		{"local n 0", "bucket: NewLocalInFlight(n = 0): n is between 1 and 1048576", func() { bucket.NewLocalInFlight(0) }},
		{"lease short", "bucket: WithLease(999ms): a lease is between 1s and 10m0s", func() { bucket.WithLease(999 * time.Millisecond) }},
		{"lease long", "bucket: WithLease(10m1s): a lease is between 1s and 10m0s", func() { bucket.WithLease(10*time.Minute + time.Second) }},
		{"lease negative", "bucket: WithLease(-1s): a lease is between 1s and 10m0s", func() { bucket.WithLease(-time.Second) }},
		{"ring", "bucket: NewInFlight does not take a *redis.Ring: its Pub/Sub does not reach across shards", func() { bucket.NewInFlight(ring, 1) }},
		{"brace prefix", `bucket: prefix "a{" holds a brace: it would choose the Cluster hash slot`, func() { bucket.NewInFlight(rdb, 1, bucket.WithPrefix("a{")) }},
		{"WithLimit", "bucket: NewInFlight does not take WithLimit (an option of NewLocal, NewRedis, NewFixedWindow, NewSlidingLog)", func() {
			bucket.NewInFlight(rdb, 1, bucket.WithLimit(bucket.Tokens, bucket.PerSecond(1)))
		}},
		{"WithLease to NewRedis", "bucket: NewRedis does not take WithLease (an option of NewInFlight)", func() {
			bucket.NewRedis(rdb, bucket.PerSecond(1), bucket.WithLease(time.Second))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.PanicsWithValue(t, tc.panic, tc.f) })
	}
	assert.NotPanics(t, func() { bucket.NewInFlight(rdb, 1<<20, bucket.WithLease(0), bucket.WithLease(10*time.Minute)) })
	for _, s := range []bucket.Semaphore{bucket.NewLocalInFlight(1), bucket.NewInFlight(rdb, 1)} {
		_, err := s.Acquire(t.Context(), "")
		assert.ErrorIs(t, err, bucket.ErrInvalidKey)
	}
}

// TestInFlightLimit: 48 goroutines on 5 slots never have more than 5 in
// flight, reach 5, and all finish; nothing is held after, and the Redis
// keys are gone.
func TestInFlightLimit(t *testing.T) {
	for _, be := range flightBackends(t) {
		t.Run(be.name, func(t *testing.T) {
			verifyNoLeaks(t)
			const n, goroutines, calls = 5, 48, 400
			s := be.new(t, n)
			key := flightKey(t)
			var in, most, done atomic.Int64
			var next atomic.Int64
			var wg sync.WaitGroup
			for range goroutines {
				wg.Go(func() {
					for next.Add(1) <= calls {
						release, err := s.Acquire(t.Context(), key)
						if !assert.NoError(t, err) {
							return
						}
						now := in.Add(1)
						for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
						}
						time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
						in.Add(-1)
						release()
						release() // a second call does nothing
						done.Add(1)
					}
				})
			}
			wg.Wait()
			t.Logf("%s: %d calls, at most %d in flight", be.name, done.Load(), most.Load())
			assert.Equal(t, int64(calls), done.Load())
			assert.Equal(t, int64(n), most.Load())
			assert.Zero(t, be.held(t, s, key))
			if be.name == "redis" {
				rdb := redistest.Client(t)
				h := "sluice:{" + key + "}/inflight"
				assert.Zero(t, rdb.Exists(t.Context(), h, h+"/queue", h+"/waiting").Val(), "no key is left")
			}
		})
	}
}

// TestInFlightFIFO: waiters get the slot in the order they came: each
// joins the queue once the one before it has, and each gives the slot back
// as soon as it has it.
func TestInFlightFIFO(t *testing.T) {
	for _, be := range flightBackends(t) {
		t.Run(be.name, func(t *testing.T) {
			const waiters = 8
			s := be.new(t, 1)
			key := flightKey(t)
			release, err := s.Acquire(t.Context(), key)
			require.NoError(t, err)
			got := make(chan int, waiters)
			var wg sync.WaitGroup
			defer wg.Wait()
			for i := range waiters {
				wg.Go(func() {
					r, err := s.Acquire(t.Context(), key)
					if assert.NoError(t, err) {
						got <- i
						r()
					}
				})
				require.Eventually(t, func() bool { return be.queued(t, s, key) == i+1 }, 5*time.Second, time.Millisecond)
			}
			release()
			var order []int
			for range waiters {
				select {
				case w := <-got:
					order = append(order, w)
				case <-time.After(5 * time.Second):
					t.Fatalf("stuck after %v", order)
				}
			}
			assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, order)
		})
	}
}

// TestInFlightCancel: a waiter whose context ends takes nothing and leaves
// the queue; one cancelled just as the slot comes hands it on. After many
// such races nothing is held and a slot is free at once.
func TestInFlightCancel(t *testing.T) {
	for _, be := range flightBackends(t) {
		t.Run(be.name, func(t *testing.T) {
			s := be.new(t, 1)
			key := flightKey(t)
			release, err := s.Acquire(t.Context(), key)
			require.NoError(t, err)
			start := time.Now() // before the deadline is set, which the wait may end at to the nanosecond
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			_, err = s.Acquire(ctx, key)
			cancel()
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
			assert.Zero(t, be.queued(t, s, key), "the waiter left the queue")
			cancelled, cancelNow := context.WithCancel(t.Context())
			cancelNow()
			_, err = s.Acquire(cancelled, key)
			assert.ErrorIs(t, err, context.Canceled, "a context done already takes nothing")

			// Races of a cancel and a release.
			var got atomic.Int64
			for i := range 100 {
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan struct{})
				go func() {
					defer close(done)
					r, err := s.Acquire(ctx, key)
					if err == nil {
						got.Add(1)
						r()
					}
				}()
				require.Eventually(t, func() bool { return be.queued(t, s, key) == 1 }, 5*time.Second, time.Millisecond)
				if i%2 == 0 {
					cancel()
					release()
				} else {
					release()
					cancel()
				}
				<-done
				release, err = s.Acquire(t.Context(), key)
				require.NoError(t, err, "race %d", i)
			}
			release()
			t.Logf("%s: %d of 100 raced waiters got the slot", be.name, got.Load())
			assert.Zero(t, be.held(t, s, key))
			assert.Zero(t, be.queued(t, s, key))
			ctx, cancel = context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			r, err := s.Acquire(ctx, key)
			require.NoError(t, err)
			r()
		})
	}
}

// TestInFlightLeaseFreesDeadHolder: the slots of an InFlight whose process
// can reach Redis no more (its client is closed: it renews nothing) go to
// the next waiter within its lease, measured from its last renewal; the
// waiter, whose process is alive, calls when the lease ends rather than
// waiting for a release that never comes.
func TestInFlightLeaseFreesDeadHolder(t *testing.T) {
	addr := redistest.Addr(t)
	const lease = time.Second
	key := flightKey(t)
	dead := redis.NewClient(&redis.Options{Addr: addr})
	d := bucket.NewInFlight(dead, 2, bucket.WithLease(lease), bucket.WithFailClosed())
	var releases []func()
	for range 2 {
		r, err := d.Acquire(t.Context(), key)
		require.NoError(t, err)
		releases = append(releases, r)
	}
	t.Cleanup(func() {
		for _, r := range releases {
			r()
		}
	})
	alive := bucket.NewInFlight(redistest.Client(t), 2, bucket.WithLease(lease))
	waited := make(chan time.Time, 2)
	var wg sync.WaitGroup
	defer wg.Wait()
	for range 2 {
		wg.Go(func() {
			r, err := alive.Acquire(t.Context(), key)
			if assert.NoError(t, err) {
				waited <- time.Now()
				r()
			}
		})
	}
	require.Eventually(t, func() bool {
		return redistest.Client(t).ZCard(t.Context(), "sluice:{"+key+"}/inflight/queue").Val() == 2
	}, 5*time.Second, time.Millisecond)
	died := time.Now()
	require.NoError(t, dead.Close()) // renewed within the last lease/3
	for range 2 {
		select {
		case at := <-waited:
			freed := at.Sub(died)
			t.Logf("a dead holder's slot went to a waiter %v after its last chance to renew (lease %v)", freed.Round(time.Millisecond), lease)
			assert.Less(t, freed, lease+500*time.Millisecond, "within the lease (and the waiter's wake-up)")
			assert.Greater(t, freed, lease/2, "not before its lease ended")
		case <-time.After(5 * lease):
			t.Fatal("the dead holder's slot never came")
		}
	}
}

// TestInFlightRedisDown: failing closed, a waiter queued on Redis fails
// with ErrUnavailable once a renewal finds Redis down, and so does a new
// call. Failing open, the waiter moves to this process's share (n over the
// fleet's members, the slots this process holds on Redis counted), the
// share's waiters wait their turn, and once Redis is back (empty: it
// restarted) the next renewal adds every slot this process holds, past n
// if need be: Redis admits nobody until fewer than n are in flight.
func TestInFlightRedisDown(t *testing.T) {
	const lease = time.Second
	t.Run("fail closed", func(t *testing.T) {
		srv := redistest.Own(t)
		rdb := fastClient(t, srv.Addr)
		s := bucket.NewInFlight(rdb, 2, bucket.WithFailClosed(), bucket.WithLease(lease), quickBreaker)
		key := flightKey(t)
		var held []func()
		for range 2 {
			r, err := s.Acquire(t.Context(), key)
			require.NoError(t, err)
			held = append(held, r)
		}
		failed := make(chan error, 1)
		go func() {
			_, err := s.Acquire(t.Context(), key)
			failed <- err
		}()
		require.Eventually(t, func() bool { return rdb.ZCard(t.Context(), "sluice:{"+key+"}/inflight/queue").Val() == 1 }, 5*time.Second, time.Millisecond)
		srv.Stop()
		start := time.Now()
		select {
		case err := <-failed:
			assert.ErrorIs(t, err, bucket.ErrUnavailable)
			t.Logf("the queued waiter failed %v after Redis stopped", time.Since(start).Round(time.Millisecond))
		case <-time.After(5 * lease):
			t.Fatal("the queued waiter never learnt that Redis is down")
		}
		_, err := s.Acquire(t.Context(), key)
		assert.ErrorIs(t, err, bucket.ErrUnavailable)
		start = time.Now()
		for _, r := range held {
			r()
		}
		assert.Less(t, time.Since(start), time.Second, "releases against a dead Redis do not hang")
	})
	t.Run("fail open", func(t *testing.T) {
		srv := redistest.Own(t)
		rdb := fastClient(t, srv.Addr)
		const n = 3
		s := bucket.NewInFlight(rdb, n, bucket.WithLease(lease), quickBreaker)
		other := bucket.NewInFlight(fastClient(t, srv.Addr), n, bucket.WithLease(lease), quickBreaker)
		key := flightKey(t)
		ctx := t.Context()
		releaseOther, err := other.Acquire(ctx, key)
		require.NoError(t, err)
		defer releaseOther()
		r1, err := s.Acquire(ctx, key)
		require.NoError(t, err)
		r2, err := s.Acquire(ctx, key)
		require.NoError(t, err)
		defer r2()
		moved := make(chan func(), 1)
		go func() {
			r, err := s.Acquire(ctx, key)
			if assert.NoError(t, err) {
				moved <- r
			}
		}()
		require.Eventually(t, func() bool { return rdb.ZCard(ctx, "sluice:{"+key+"}/inflight/queue").Val() == 1 }, 5*time.Second, time.Millisecond)
		srv.Stop()
		start := time.Now()
		var r3 func()
		select {
		case r3 = <-moved:
			t.Logf("the queued waiter took the share's last slot %v after Redis stopped", time.Since(start).Round(time.Millisecond))
		case <-time.After(5 * lease):
			t.Fatal("the queued waiter never moved to the share")
		}
		defer r3()
		// The share is n (one member: every bucket here counts as this
		// process), and this process has n in flight.
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err = s.Acquire(short, key)
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded, "the share is full")
		got := make(chan func(), 1)
		go func() {
			r, err := s.Acquire(ctx, key)
			if assert.NoError(t, err) {
				got <- r
			}
		}()
		time.Sleep(50 * time.Millisecond)
		r1()
		var r4 func()
		select {
		case r4 = <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("a slot released on the share went to nobody")
		}
		defer r4()

		require.NoError(t, srv.Restart())
		held := func() int {
			h, err := s.Held(ctx, key)
			if err != nil {
				return -1
			}
			return h
		}
		require.Eventually(t, func() bool { return held() == n+1 }, 5*time.Second, 10*time.Millisecond,
			"the renewals add this process's 3 slots and the other's 1")
		short, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
		_, err = other.Acquire(short, key)
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded, "over n, Redis admits nobody")
	})
}

// TestInFlightKeys: the sets are named <prefix>:{<key>}/inflight[/queue,
// /waiting], a key's braces escaped; while held or waited for they expire
// a second after the last lease they hold ends, and once nothing is they
// are gone. The waiters' process listens on <prefix>:inflight:<pid>.<id>.
func TestInFlightKeys(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := t.Context()
	const lease = 2 * time.Second
	s := bucket.NewInFlight(rdb, 1, bucket.WithPrefix("p"), bucket.WithLease(lease), bucket.WithRedisTimeout(time.Second))
	key := "a{b}-" + flightKey(t)
	h := "p:{a%7Bb%7D-" + key[len("a{b}-"):] + "}/inflight"
	release, err := s.Acquire(ctx, key)
	require.NoError(t, err)
	members := rdb.ZRangeWithScores(ctx, h, 0, -1).Val()
	require.Len(t, members, 1)
	assert.Regexp(t, `^[0-9]+\.[0-9a-f]{12}/[0-9]+$`, members[0].Member)
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	assert.InDelta(t, float64(now.Add(lease).UnixMicro()), members[0].Score, float64(100*time.Millisecond/time.Microsecond), "scored by the lease's end")
	ttl := rdb.PTTL(ctx, h).Val()
	assert.Greater(t, ttl, lease)
	assert.LessOrEqual(t, ttl, lease+time.Second)

	done := make(chan struct{})
	go func() {
		defer close(done)
		r, err := s.Acquire(ctx, key)
		if assert.NoError(t, err) {
			r()
		}
	}()
	require.Eventually(t, func() bool { return rdb.ZCard(ctx, h+"/queue").Val() == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, int64(1), rdb.ZCard(ctx, h+"/waiting").Val())
	for _, k := range []string{h + "/queue", h + "/waiting"} {
		assert.Greater(t, rdb.PTTL(ctx, k).Val(), lease, k)
	}
	channels := rdb.PubSubChannels(ctx, "p:inflight:*").Val()
	require.Len(t, channels, 1)
	assert.Regexp(t, `^p:inflight:[0-9]+\.[0-9a-f]{12}$`, channels[0])
	release()
	<-done
	assert.Zero(t, rdb.Exists(ctx, h, h+"/queue", h+"/waiting").Val(), "nothing held or waited for: gone")
	assert.Eventually(t, func() bool { return len(rdb.PubSubChannels(ctx, "p:inflight:*").Val()) == 0 },
		5*time.Second, 10*time.Millisecond, "the subscription ends once nothing waits")
}

// TestInFlightMisconfiguredRedis: an ACL user who may not subscribe to the
// InFlight's channels (Redis 7's default for a new user), or a server that
// may evict, is a *ConfigError that says what to do, failing open or
// closed; the slots it may have taken are given back.
func TestInFlightMisconfiguredRedis(t *testing.T) {
	t.Run("NOPERM channels", func(t *testing.T) {
		srv := redistest.Own(t)
		admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { admin.Close() })
		require.NoError(t, admin.Do(t.Context(), "ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "resetchannels").Err())
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "app", Password: "pw"})
		t.Cleanup(func() { rdb.Close() })
		s := bucket.NewInFlight(rdb, 1, bucket.WithLease(time.Second), bucket.WithLogger(slog.New(slog.DiscardHandler)))
		time.Sleep(2 * time.Second) // a server just started grants no slot for a renewal and a second (see InFlight)
		release, err := s.Acquire(t.Context(), "k")
		require.NoError(t, err, "a free slot needs no channel")
		_, err = s.Acquire(t.Context(), "k")
		require.ErrorIs(t, err, bucket.ErrMisconfigured)
		assert.Contains(t, err.Error(), "SUBSCRIBE and the channels <prefix>:inflight:*")
		release()
		assert.Zero(t, admin.Exists(t.Context(), "sluice:{k}/inflight", "sluice:{k}/inflight/queue").Val())
	})
	t.Run("maxmemory-policy", func(t *testing.T) {
		srv := redistest.Own(t, "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { rdb.Close() })
		for _, policy := range []bucket.Option{bucket.WithFailOpen(), bucket.WithFailClosed()} {
			var logged strings.Builder
			s := bucket.NewInFlight(rdb, 1, policy, bucket.WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
			_, err := s.Acquire(t.Context(), "k")
			require.ErrorIs(t, err, bucket.ErrMisconfigured)
			assert.Contains(t, err.Error(), "maxmemory-policy noeviction")
			assert.Contains(t, logged.String(), "level=ERROR")
		}
		r, err := bucket.NewInFlight(rdb, 1, bucket.WithEvictionAllowed()).Acquire(t.Context(), "k")
		require.NoError(t, err)
		r()
	})
}

// BenchmarkInFlightHandoff measures a hand-off between two InFlights, as
// between two processes: from one's release to the other's Acquire
// returning, through the leave script and a Pub/Sub message.
func BenchmarkInFlightHandoff(b *testing.B) {
	addr := redistest.Addr(b)
	newSem := func() *bucket.InFlight {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		b.Cleanup(func() { rdb.Close() })
		return bucket.NewInFlight(rdb, 1)
	}
	x, y := newSem(), newSem()
	watch := redistest.Client(b)
	key := fmt.Sprintf("handoff-%d", time.Now().UnixNano())
	release, err := x.Acquire(b.Context(), key)
	require.NoError(b, err)
	b.ReportAllocs()
	b.ResetTimer()
	var total time.Duration
	for i := range b.N {
		next := y
		if i%2 == 1 {
			next = x
		}
		got := make(chan func())
		go func() {
			r, err := next.Acquire(b.Context(), key)
			if err != nil {
				panic(err)
			}
			got <- r
		}()
		for watch.ZCard(b.Context(), "sluice:{"+key+"}/inflight/queue").Val() == 0 {
			time.Sleep(50 * time.Microsecond)
		}
		start := time.Now()
		release()
		release = <-got
		total += time.Since(start)
	}
	b.StopTimer()
	release()
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs/handoff")
}

// TestInFlightRestartKeepsTheLimit: n = 4, two processes of four callers
// each, calls of 1 to 2 s, and Redis restarted empty between two renewals
// (lease 6 s: a renewal every 2 s), three times. Before, the restarted
// Redis had no holders and granted n slots at once while the calls in
// flight went on: 6-7 in flight at the upstream. Now it grants none until
// the holders have renewed (for 3 s after it starts: see InFlight), and
// the upstream never sees more than n.
func TestInFlightRestartKeepsTheLimit(t *testing.T) {
	const n = 4
	srv := redistest.Own(t)
	time.Sleep(3 * time.Second) // past the server's first start
	key := flightKey(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var inFlight, most, calls atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		s := bucket.NewInFlight(fastClient(t, srv.Addr), n, bucket.WithLease(6*time.Second), bucket.WithFailClosed(), quickBreaker)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					release, err := s.Acquire(ctx, key)
					if err != nil {
						time.Sleep(10 * time.Millisecond) // Redis is down: fail closed, try again
						continue
					}
					now := inFlight.Add(1)
					for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
					}
					calls.Add(1)
					time.Sleep(time.Second + rand.N(time.Second))
					inFlight.Add(-1)
					release()
				}
			}()
		}
	}
	for range 3 {
		time.Sleep(2500 * time.Millisecond)
		srv.Stop()
		require.NoError(t, srv.Restart())
	}
	time.Sleep(4 * time.Second)
	cancel()
	wg.Wait()
	t.Logf("n = %d, Redis restarted empty 3 times: %d calls, at most %d in flight at the upstream", n, calls.Load(), most.Load())
	assert.LessOrEqual(t, most.Load(), int64(n))
	assert.Greater(t, calls.Load(), int64(10), "the callers got slots after the restarts")
}
