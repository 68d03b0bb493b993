//go:build !unix

package tiktoken

import "time"

// processCPU reports false: the tests measure wall time here.
func processCPU() (time.Duration, bool) { return 0, false }
