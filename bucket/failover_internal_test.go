package bucket

// Tests of the failure policy's internals, from an adversarial review of
// this round's changes: each failed on the code it names.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestMisconfigThenHang: after a ConfigError, a Redis that hangs opens the
// breaker as any would (with the ConfigError kept, and returned meanwhile):
// a rule of this stop turned each failure into that error without telling
// the breaker, and every call paid the 250 ms timeout.
func TestMisconfigThenHang(t *testing.T) {
	srv := redistest.Own(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { admin.Close() })
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "-evalsha", "-eval").Err(); err != nil {
		t.Fatal(err)
	}
	p := redistest.NewProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, Username: "app", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	b := NewRedis(rdb, PerSecond(100), WithPrefix(fmt.Sprintf("mishang%d", time.Now().UnixNano())), WithLogger(slog.New(slog.DiscardHandler)))
	_, err := b.Reserve(t.Context(), "k", N(1), 0)
	t.Logf("first: %v", err)
	if !errors.Is(err, ErrMisconfigured) {
		t.Fatalf("want a ConfigError first, got %v", err)
	}
	p.SetLatency(time.Hour) // Redis hangs
	var slow int
	for range 12 {
		s := time.Now()
		_, err := b.Reserve(t.Context(), "k", N(1), 0)
		if time.Since(s) >= 200*time.Millisecond {
			slow++
		}
		if !errors.Is(err, ErrMisconfigured) {
			t.Errorf("got %v: the configuration error is kept while it is fresh", err)
		}
	}
	if slow > 2 {
		t.Errorf("%d of 12 calls paid a Redis timeout: the breaker never opened", slow)
	}
}

// TestSettleOutlivesCallerDeadline: the first call on a key after an outage
// settles the share's debt under a context of its own: with the caller's, a
// caller whose deadline was near lost the whole debt, and Redis kept 9.6 of
// 10 tokens.
func TestSettleOutlivesCallerDeadline(t *testing.T) {
	srv := redistest.Own(t)
	p := redistest.NewProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	b := NewRedis(rdb, PerSecond(10), WithPrefix(fmt.Sprintf("settle%d", time.Now().UnixNano())))
	ctx := t.Context()
	if _, err := b.Reserve(ctx, "k", N(1), 0); err != nil {
		t.Fatal(err)
	}
	p.Refuse(true)
	p.ResetAll()
	admitted := 0
	for range 10 {
		r, err := b.Reserve(ctx, "k", N(1), 5*time.Second)
		if err == nil && r.OK {
			admitted++
		}
	}
	p.Refuse(false)
	for b.fo.cb.State() == gobreaker.StateOpen {
		time.Sleep(20 * time.Millisecond)
	}
	for {
		if _, err := b.Reserve(ctx, "warm", N(1), 0); err == nil && !b.fo.failing.Load() {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.SetLatency(40 * time.Millisecond)
	settled := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	r, err := b.Reserve(cctx, "k", N(1), 0)
	cancel()
	if err != nil || !r.OK {
		t.Skipf("the first call back did not work within its deadline (%+v %v): nothing to settle", r, err)
	}
	p.SetLatency(0)
	tk, err := b.Tokens(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	// At most what refilled since the settle, at 10/s (on a loaded machine
	// the read may come well after it); the debt lost, Redis kept 9.6.
	if refilled := 10 * time.Since(settled).Seconds(); tk[Requests] > max(refilled, 1) {
		t.Errorf("the share's debt of %d was lost: Redis has %v tokens, %.2f refilled since the settle", admitted, tk[Requests], refilled)
	}
}

// TestSharesDoNotChain: every lost reply (isolated: within a second of a
// call that worked) starts a new share, which looks back at the last one's
// queue, but no further: replaced shares are collected. Each share's start
// held the share before it, and 0 of 299 were collected (with 30% of
// replies lost, 1,823 shares in 3 s, the heap from 788 to 2,658 KiB).
func TestSharesDoNotChain(t *testing.T) {
	srv := redistest.Own(t)
	p := redistest.NewProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, PoolSize: 1})
	t.Cleanup(func() { rdb.Close() })
	b := NewRedis(rdb, PerSecond(1000), WithPrefix(fmt.Sprintf("chain%d", time.Now().UnixNano())))
	ctx := t.Context()
	var finalized atomic.Int64
	made := 0
	var last *share
	for i := range 300 {
		if _, err := b.Reserve(ctx, fmt.Sprintf("k%d", i), N(1), time.Second); err != nil {
			t.Fatal(err)
		}
		p.SetDropReplies(1)
		_, err := b.Reserve(ctx, fmt.Sprintf("k%d", i), N(1), time.Second)
		p.SetDropReplies(0)
		if err != nil {
			t.Fatal(err) // the share takes it
		}
		if sh := b.fo.share.Load(); sh != nil && sh != last {
			last = sh
			made++
			runtime.SetFinalizer(sh.local, func(*Local) { finalized.Add(1) })
		}
	}
	for range 5 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("shares made: %d, collected: %d", made, finalized.Load())
	if made < 100 {
		t.Fatalf("only %d shares made: the test did not flap", made)
	}
	if finalized.Load() < int64(made)/2 {
		t.Errorf("only %d of %d replaced shares were collected: the shares chain", finalized.Load(), made-1)
	}
}

// TestIsolatedFailureIsNoOutage: a call that timed out while a call begun
// after it was served failed alone (a slow connection, this process's own
// pause): its share takes it, but does not count it as the fleet's outage,
// so the settle after it debits no other member's share. Every such
// timeout had the first call back debit (n-1) times its debt again: with
// 50 members, a single 4,000-token call cost the fleet 196,000 tokens.
func TestIsolatedFailureIsNoOutage(t *testing.T) {
	srv := redistest.Own(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	b := NewRedis(rdb, PerSecond(1000), WithPrefix(fmt.Sprintf("isolated%d", time.Now().UnixNano())))
	ctx := t.Context()
	if _, err := b.Reserve(ctx, "k", N(1), time.Second); err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		time.Sleep(20 * time.Millisecond) // begun after the slow call
		if _, err := b.Reserve(ctx, "k", N(1), time.Second); err != nil {
			t.Error(err)
		}
	}()
	err := b.fo.call(ctx, time.Second, func(cctx context.Context) error {
		<-served
		return context.DeadlineExceeded // as a timed-out read says
	})
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		t.Fatalf("the slow call: %v, want an *UnavailableError", err)
	}
	sh := b.fo.fallback(err)
	if sh == nil {
		t.Fatal("no share took the isolated failure")
	}
	if sh.outage.Load() {
		t.Error("a failure alone, after which Redis served a later call, was taken for the fleet's outage")
	}
	notIsolated := &UnavailableError{Addr: ue.Addr, Err: context.DeadlineExceeded}
	if sh := b.fo.fallback(notIsolated); sh == nil || !sh.outage.Load() {
		t.Error("a timeout that did not fail alone was not taken for an outage")
	}
}
