package bucket

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// contact is a bucket's first contact with Redis, made before its first
// call and again while it finds a configuration error: it opens a
// connection (several round trips, which a slow Redis must not be taken
// for dead over), measures the latency, checks maxmemory-policy, and loads
// the scripts, so that the first calls do not pay for EVAL's script text.
type contact struct {
	done   atomic.Bool // made, nothing wrong found
	failed atomic.Bool // the last try found Redis unavailable

	lock chan struct{} // holds a value while one is made
	err  *ConfigError  // what was wrong, if anything
	at   time.Time     // when err was found
}

func newContact() contact { return contact{lock: make(chan struct{}, 1)} }

// errContacting is the cause of the *UnavailableError of a call that found
// another one making the contact, after a contact that failed.
var errContacting = errors.New("first contact under way")

// ready makes the first contact if it is due, and returns the configuration
// error it found, if any; an *UnavailableError if Redis could not be
// reached (the contact is made again by a later call). Calls wait for a
// contact made by another, but once one has failed, they do not: Redis may
// be frozen, and each would wait out the contact's timeout.
func (c *contact) ready(ctx context.Context, f *failover) error {
	if c.done.Load() {
		return nil
	}
	if !c.failed.Load() {
		select {
		case c.lock <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	} else {
		select {
		case c.lock <- struct{}{}:
		default:
			return &UnavailableError{Addr: f.addr, Err: errContacting}
		}
	}
	defer func() { <-c.lock }()
	if c.done.Load() {
		return nil
	}
	if c.err != nil && time.Since(c.at) < recheckEvery {
		return c.err
	}
	start := time.Now()
	err := f.call(ctx, max(contactTimeout, 4*f.timeout), func(ctx context.Context) error {
		return f.forEachServer(ctx, func(ctx context.Context, rdb redis.UniversalClient) error {
			return f.check(ctx, rdb)
		})
	})
	var ce *ConfigError
	switch {
	case err == nil:
		c.err = nil
		f.latency.Store(int64(time.Since(start)))
		c.done.Store(true)
	case errors.As(err, &ce):
		c.err, c.at = ce, time.Now()
	case errors.Is(err, ErrUnavailable):
		c.failed.Store(true)
	}
	return err
}

// found records ce, found after the first contact: every call returns it
// until a contact finds the server right again. If a contact is under way,
// it will tell.
func (c *contact) found(ce *ConfigError) {
	select {
	case c.lock <- struct{}{}:
		c.err, c.at = ce, time.Now()
		c.done.Store(false)
		<-c.lock
	default:
	}
}

// forEachServer runs fn on every master of a Cluster, or on rdb.
func (f *failover) forEachServer(ctx context.Context, fn func(context.Context, redis.UniversalClient) error) error {
	if cc, ok := f.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return fn(ctx, c) })
	}
	return fn(ctx, f.rdb)
}

// check reads one server's maxmemory-policy, then loads the scripts on it:
// two round trips (a server that wants a password closes the connection of
// a client that sends it a long command before it).
func (f *failover) check(ctx context.Context, rdb redis.UniversalClient) error {
	info := rdb.Info(ctx, "memory")
	if err := f.checked(ctx, info); err != nil {
		return err
	}
	if info.Err() == nil && !f.evictable {
		if p := infoField(info.Val(), "maxmemory_policy"); p != "" && p != "noeviction" {
			return &ConfigError{Addr: f.addr, Err: fmt.Errorf("%w: it is %s", errEviction, p)}
		}
	}
	pipe := rdb.Pipeline()
	loads := make([]*redis.StringCmd, len(scripts))
	for i, s := range scripts {
		loads[i] = pipe.ScriptLoad(ctx, s.src)
	}
	_, _ = pipe.Exec(ctx)
	for _, cmd := range loads {
		if err := f.checked(ctx, cmd); err != nil {
			return err
		}
	}
	return nil
}

// checked returns cmd's error if it is a failure or a configuration error;
// else, if it failed, it logs that the contact could not check what cmd
// would have: it is not allowed to look, or to load (EVAL will tell if it
// cannot run the scripts either), or the server does not know the command
// (miniredis has no INFO memory).
func (f *failover) checked(ctx context.Context, cmd redis.Cmder) error {
	err := cmd.Err()
	if err == nil {
		return nil
	}
	if redisFailure(err) || redis.IsAuthError(err) {
		return err
	}
	level := slog.LevelDebug
	if redis.IsPermissionError(err) {
		level = slog.LevelWarn
	}
	f.logger().LogAttrs(ctx, level, "sluice: redis first contact could not check",
		slog.String("addr", f.addr), slog.String("command", cmd.Name()), slog.String("err", err.Error()))
	return nil
}

// infoField returns the value of field in an INFO reply, "" if it has none.
func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), field+":"); ok {
			return v
		}
	}
	return ""
}
