//go:build !linux

package redistest

import "os/exec"

// dieWithParent does nothing: only Linux can tie a process's life to its
// parent's.
func dieWithParent(*exec.Cmd) {}
