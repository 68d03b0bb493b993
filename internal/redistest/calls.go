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
	calls, _ := ScriptStats(t, rdb)
	return calls
}

// ScriptStats returns the script calls that rdb's server has served (see
// ScriptCalls) and the CPU time they took, in microseconds.
func ScriptStats(t testing.TB, rdb redis.UniversalClient) (calls, usec int64) {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("redistest: INFO commandstats: %v", err)
	}
	for line := range strings.Lines(info) {
		name, stats, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch name {
		case "cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro", "cmdstat_fcall", "cmdstat_fcall_ro":
		default:
			continue
		}
		for field := range strings.SplitSeq(stats, ",") {
			k, v, _ := strings.Cut(field, "=")
			if k != "calls" && k != "usec" {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("redistest: commandstats %q: %v", line, err)
			}
			if k == "calls" {
				calls += n
			} else {
				usec += n
			}
		}
	}
	return calls, usec
}
