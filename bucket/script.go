package bucket

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/wait"
)

// script is a Lua script that runs at most once per call: by EVALSHA, or
// by EVAL when the server does not have it (NOSCRIPT: it did not run). A
// call is never retried after its command was sent: go-redis replays a
// command whose reply was lost to a broken connection, and a script that
// ran but whose reply was lost would take or refund twice. Such a call
// fails instead, as a Redis failure.
type script struct {
	src, hash       string
	srcArg, hashArg any // src and hash as arguments, boxed once
}

// scripts are every script of the package, loaded at first contact.
var scripts []*script

func newScript(src string) *script {
	src = withCodec(src)
	sum := sha1.Sum([]byte(src))
	s := &script{src: src, hash: hex.EncodeToString(sum[:])}
	s.srcArg, s.hashArg = s.src, s.hash
	scripts = append(scripts, s)
	return s
}

// onceCmd is a command that go-redis must not send again once it was sent.
type onceCmd struct{ *redis.Cmd }

func (onceCmd) NoRetry() bool { return true }

// run runs s with keys and args on rdb. A call that certainly did not run
// (see notRun) is tried again, up to three times, after 8, 32 and 128 ms
// (within the call's timeout), as go-redis would have: a cluster settling,
// a server loading, a connection that could not be made.
func (s *script) run(ctx context.Context, rdb redis.UniversalClient, keys []string, args ...any) *redis.Cmd {
	return s.runArgv(ctx, rdb, scriptArgv(keys, args))
}

// argvHead is how many arguments of a script call come before its keys:
// EVALSHA (or EVAL), the hash (or the source), the number of keys.
const argvHead = 3

// scriptArgv is the argv of a call of a script with keys and args, its
// first two left for once to fill.
func scriptArgv(keys []string, args []any) []any {
	argv := make([]any, argvHead, argvHead+len(keys)+len(args))
	argv[2] = len(keys)
	for _, k := range keys {
		argv = append(argv, k)
	}
	return append(argv, args...)
}

// runArgv is run with its argv built (see scriptArgv).
func (s *script) runArgv(ctx context.Context, rdb redis.UniversalClient, argv []any) *redis.Cmd {
	for attempt := 0; ; attempt++ {
		cmd := s.once(ctx, rdb, argv)
		if attempt == 3 || !notRun(cmd.Err()) {
			return cmd
		}
		if wait.Sleep(ctx, 8*time.Millisecond<<(2*attempt)) != nil {
			return cmd
		}
	}
}

// once sends s once: EVALSHA, then EVAL if the server does not have it.
func (s *script) once(ctx context.Context, rdb redis.UniversalClient, argv []any) *redis.Cmd {
	argv[0], argv[1] = "evalsha", s.hashArg
	cmd := redis.NewCmd(ctx, argv...)
	_ = rdb.Process(ctx, onceCmd{cmd})
	if err := cmd.Err(); err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
		return cmd
	}
	argv[0], argv[1] = "eval", s.srcArg
	cmd = redis.NewCmd(ctx, argv...)
	_ = rdb.Process(ctx, onceCmd{cmd})
	return cmd
}

// notRun reports whether err says that a script certainly did not run: the
// server turned it away before running it, or it was never sent.
func notRun(err error) bool {
	if err == nil {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || errors.Is(err, redis.ErrPoolTimeout) {
		return true
	}
	return redis.IsClusterDownError(err) || redis.IsTryAgainError(err) || redis.IsLoadingError(err) ||
		redis.IsMasterDownError(err) || redis.HasErrorPrefix(err, "BUSY ")
}
