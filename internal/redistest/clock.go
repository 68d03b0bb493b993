package redistest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// OwnSkewed is Own for a server whose wall clock (TIME, and the expiry of
// keys) reads offset from the real one; its monotonic clock, which drives
// its timers, is untouched.
//
// libfaketime would do, but not for Debian's redis-server: that is linked
// with jemalloc, which calls clock_gettime while libfaketime initialises,
// and the server dies at start ("Unexpected recursive calls to
// clock_gettime()", libfaketime issue 130). So OwnSkewed builds a shim of
// its own with the C compiler (cc), which calls the kernel directly and
// never allocates, and preloads it.
func OwnSkewed(t testing.TB, offset time.Duration, extra ...string) *Server {
	t.Helper()
	lib, err := buildClockShim(t.TempDir())
	if err != nil {
		Unavailable(t, err)
	}
	env := []string{"LD_PRELOAD=" + lib, "SLUICE_CLOCK_OFFSET_US=" + strconv.FormatInt(offset.Microseconds(), 10)}
	s, err := startConf("", env, extra)
	if err != nil {
		Unavailable(t, err)
	}
	t.Cleanup(s.Stop)
	return s
}

// clockShim shifts CLOCK_REALTIME (clock_gettime, gettimeofday, time) by
// SLUICE_CLOCK_OFFSET_US microseconds. It reads every clock with the raw
// system call rather than through the C library's symbols it replaces.
const clockShim = `
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_us;

__attribute__((constructor)) static void init(void) {
	const char *s = getenv("SLUICE_CLOCK_OFFSET_US");
	if (s) offset_us = strtoll(s, 0, 10);
}

int clock_gettime(clockid_t id, struct timespec *ts) {
	int r = syscall(SYS_clock_gettime, id, ts);
	if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
		long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_us * 1000LL;
		ts->tv_sec = ns / 1000000000LL;
		ts->tv_nsec = ns % 1000000000LL;
	}
	return r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
	struct timespec ts;
	int r = clock_gettime(CLOCK_REALTIME, &ts);
	if (r == 0 && tv) {
		tv->tv_sec = ts.tv_sec;
		tv->tv_usec = ts.tv_nsec / 1000;
	}
	return r;
}

time_t time(time_t *out) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	if (out) *out = ts.tv_sec;
	return ts.tv_sec;
}
`

// buildClockShim compiles clockShim into dir and returns the library's path.
func buildClockShim(dir string) (string, error) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		return "", fmt.Errorf("redistest: a C compiler (cc) is needed to skew a server's clock: %w", err)
	}
	src, lib := filepath.Join(dir, "clockshim.c"), filepath.Join(dir, "clockshim.so")
	if err := os.WriteFile(src, []byte(clockShim), 0o600); err != nil {
		return "", err
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", lib, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("redistest: build clock shim: %v\n%s", err, out)
	}
	return lib, nil
}
