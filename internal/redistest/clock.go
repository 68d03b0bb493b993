package redistest

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"
)

// Clock is the wall clock of a server started by Clocked: what the server
// reads for TIME (in scripts too) and for the expiry of keys. It is frozen:
// it reads what the test last set, to the microsecond, and moves only when
// the test moves it. The server's monotonic clock, which drives its
// timers, runs on. Safe for concurrent use.
//
// Redis deletes a key once the clock is past its expiry, in whole
// milliseconds: a key with a PTTL of 1000 ms is still there 1000 ms later
// (its PTTL is 0) and gone a millisecond after that.
type Clock struct {
	mu   sync.Mutex
	mem  []byte // the clock word, mapped from the file the server's shim maps
	word *int64 // &mem[0]
	now  time.Time
}

// Clocked starts a redis-server for t alone, as Own does, whose wall clock
// is frozen at start (to the microsecond) until the test moves it with the
// returned Clock. The server keeps its clock across Stop and Restart.
func Clocked(t testing.TB, start time.Time, extra ...string) (*Server, *Clock) {
	t.Helper()
	start = start.Truncate(time.Microsecond)
	s, c := ownClocked(t, frozenWord(start), extra)
	c.now = start
	// The shim must have taken: a server on the real clock would pass
	// some tests by luck and fail others at random.
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("redistest: TIME of a clocked server: %v", err)
	}
	if !now.Equal(start) {
		Unavailable(t, fmt.Errorf("redistest: the clock shim did not take: TIME is %v, not %v", now, start))
	}
	return s, c
}

// OwnSkewed is Own for a server whose wall clock (TIME, and the expiry of
// keys) reads offset from the real one; its monotonic clock, which drives
// its timers, is untouched.
func OwnSkewed(t testing.TB, offset time.Duration, extra ...string) *Server {
	t.Helper()
	s, _ := ownClocked(t, offsetWord(offset), extra)
	return s
}

// ownClocked starts a server for t alone with the clock shim preloaded,
// reading a clock word first set to w.
//
// libfaketime would do, but not for Debian's redis-server: that is linked
// with jemalloc, which calls clock_gettime while libfaketime initialises,
// and the server dies at start ("Unexpected recursive calls to
// clock_gettime()", libfaketime issue 130). So the shim is our own, built
// with the C compiler (cc): it calls the kernel directly and never
// allocates.
func ownClocked(t testing.TB, w int64, extra []string) (*Server, *Clock) {
	t.Helper()
	lib, err := clockShim()
	if err != nil {
		Unavailable(t, err)
	}
	path := filepath.Join(t.TempDir(), "clock")
	c, err := mapClock(path, w)
	if err != nil {
		t.Fatalf("redistest: clock file: %v", err)
	}
	t.Cleanup(c.unmap) // after the server stops: cleanups run last first
	s, err := startConf("", []string{"LD_PRELOAD=" + lib, "SLUICE_CLOCK_FILE=" + path}, extra)
	if err != nil {
		Unavailable(t, err)
	}
	t.Cleanup(s.Stop)
	return s, c
}

// Set sets the server's clock to at, to the microsecond; it may go back.
func (c *Clock) Set(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set(at.Truncate(time.Microsecond))
}

// Advance moves the server's clock by d (back, if d < 0), to the
// microsecond.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set(c.now.Add(d).Truncate(time.Microsecond))
}

// Now returns what the server's clock reads.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// set stores the clock word for at; c.mu must be held. The server reads
// the new time from its next command on.
func (c *Clock) set(at time.Time) {
	if c.word == nil {
		panic("redistest: Clock used after its test ended")
	}
	atomic.StoreInt64(c.word, frozenWord(at))
	c.now = at
}

// The clock word, one int64 the shim loads atomically on every reading of
// the wall clock, is 2·v+1 for a clock frozen at v µs after the Unix epoch
// and 2·v for the real clock offset by v µs.
func frozenWord(at time.Time) int64    { return 2*at.UnixMicro() + 1 }
func offsetWord(d time.Duration) int64 { return 2 * d.Microseconds() }

// mapClock writes w to a new file at path and maps it, shared, for the
// Clock to write to.
func mapClock(path string, w int64) (*Clock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := binary.Write(f, binary.NativeEndian, w); err != nil {
		return nil, err
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, 8, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return &Clock{mem: mem, word: (*int64)(unsafe.Pointer(&mem[0]))}, nil
}

func (c *Clock) unmap() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mem != nil {
		syscall.Munmap(c.mem)
		c.mem, c.word = nil, nil
	}
}

// clockShim replaces the wall clock (CLOCK_REALTIME and its coarse
// variant, through clock_gettime, gettimeofday and time) with the clock
// word in the file SLUICE_CLOCK_FILE names (see frozenWord), mapped once
// at load and loaded atomically on every call. It reads the kernel's
// clocks with the raw system call rather than through the C library's
// symbols it replaces. Calls before its constructor has run (jemalloc's,
// while it initialises) read the real clock.
const clockShimSource = `
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const long long *word;

__attribute__((constructor)) static void init(void) {
	const char *path = getenv("SLUICE_CLOCK_FILE");
	if (!path) return;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	void *p = fd < 0 ? MAP_FAILED : mmap(0, sizeof(long long), PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		perror("clock shim: SLUICE_CLOCK_FILE");
		_exit(1);
	}
	close(fd);
	word = p;
}

static void set_us(struct timespec *ts, long long us) {
	long long s = us / 1000000, r = us % 1000000;
	if (r < 0) { r += 1000000; s--; }
	ts->tv_sec = s;
	ts->tv_nsec = r * 1000;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
	if (!word || (id != CLOCK_REALTIME && id != CLOCK_REALTIME_COARSE))
		return syscall(SYS_clock_gettime, id, ts);
	long long w = __atomic_load_n(word, __ATOMIC_ACQUIRE);
	long long frozen = w & 1, v = (w - frozen) / 2;
	if (frozen) {
		set_us(ts, v);
		return 0;
	}
	int r = syscall(SYS_clock_gettime, id, ts);
	if (r == 0) {
		long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + v * 1000LL;
		long long s = ns / 1000000000LL, n = ns % 1000000000LL;
		if (n < 0) { n += 1000000000LL; s--; }
		ts->tv_sec = s;
		ts->tv_nsec = n;
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

var shim struct {
	once sync.Once
	lib  string
	err  error
}

// clockShim returns the path of the clock shim, built once per process,
// and then only if the user's cache holds no build of this source yet.
func clockShim() (string, error) {
	shim.once.Do(func() { shim.lib, shim.err = buildClockShim() })
	return shim.lib, shim.err
}

// buildClockShim compiles clockShimSource into the user's cache directory
// (the system's temporary one if there is none), under a name that is the
// hash of the source and the platform, and returns the library's path.
func buildClockShim() (string, error) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		return "", fmt.Errorf("redistest: a C compiler (cc) is needed to set a server's clock: %w", err)
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	dir = filepath.Join(dir, "sluice-redistest")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(runtime.GOOS + "/" + runtime.GOARCH + "\n" + clockShimSource))
	lib := filepath.Join(dir, "clockshim-"+hex.EncodeToString(sum[:8])+".so")
	if _, err := os.Stat(lib); err == nil {
		return lib, nil
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	src, out := filepath.Join(tmp, "clockshim.c"), filepath.Join(tmp, "clockshim.so")
	if err := os.WriteFile(src, []byte(clockShimSource), 0o600); err != nil {
		return "", err
	}
	if msg, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", out, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("redistest: build clock shim: %v\n%s", err, msg)
	}
	// Whole or not at all, for other test processes building it too.
	return lib, os.Rename(out, lib)
}
