// Package demo holds what the example programs share: reading a Redis URL
// from the command line without ever echoing its password, and small waits.
package demo

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// QuietLogger discards go-redis's log lines: the examples report every Redis
// error through a returned error, which the log lines would only repeat.
type QuietLogger struct{}

// Printf implements go-redis's logger.
func (QuietLogger) Printf(context.Context, string, ...any) {}

// RedisURL returns s as a Redis URL that redis.ParseURL accepts: a bare
// host:port becomes redis://host:port. The error never quotes s, which may
// hold a password.
func RedisURL(s string) (string, error) {
	if !strings.Contains(s, "://") {
		s = "redis://" + s
	}
	if _, err := redis.ParseURL(s); err != nil {
		if ue := (*url.Error)(nil); errors.As(err, &ue) { // it quotes the whole URL
			return "", errors.New("not a valid URL (redis://[user:password@]host:port[/db])")
		}
		return "", err
	}
	return s, nil
}

// Redacted returns a Redis URL fit for messages: without its password.
func Redacted(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "the Redis server"
	}
	return u.Redacted()
}

// Ping checks that the Redis server at redisURL answers within timeout.
func Ping(ctx context.Context, redisURL string, timeout time.Duration) error {
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return err
	}
	opt.MaxRetries = -1 // the dials are retried already
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return rdb.Ping(ctx).Err()
}

// SleepUntil waits until t, or until ctx is done.
func SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
