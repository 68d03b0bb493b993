package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// ScriptCalls returns the script calls (EVAL, EVALSHA, their read-only
// forms and FCALL) that rdb's server has served, from INFO commandstats.
func ScriptCalls(t testing.TB, rdb redis.UniversalClient) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("redistest: INFO commandstats: %v", err)
	}
	var n int64
	for line := range strings.Lines(info) {
		name, stats, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch name {
		case "cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro", "cmdstat_fcall", "cmdstat_fcall_ro":
		default:
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
		c, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("redistest: %q: %v", line, err)
		}
		n += c
	}
	return n
}
