package redistest

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill cmd's process when the test process
// that started it dies, even if it is killed without running its cleanups.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
