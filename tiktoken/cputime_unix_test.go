//go:build unix

package tiktoken

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time this process has used, user and system,
// and true: what a test measures against a bound that must hold however
// loaded the machine is.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
