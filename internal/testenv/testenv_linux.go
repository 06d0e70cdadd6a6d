//go:build linux

package testenv

import (
	"os"
	"syscall"
)

// Linux system call numbers, the same on every architecture (the unified
// table that pidfd_open joined in Linux 5.3).
const (
	sysPidfdOpen  = 434
	sysPidfdGetfd = 438
)

// sharedFD returns a duplicate of file descriptor fd of process pid that
// shares its open file description, and so its file offset. Bytes written
// through it land where the process would write next, and the process's
// own next write comes after them. It needs Linux 5.6 and the right to
// ptrace pid (same user without Yama's restriction, or root).
func sharedFD(pid, fd int) (*os.File, error) {
	pidfd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), 0, 0)
	if errno != 0 {
		return nil, errno
	}
	defer syscall.Close(int(pidfd))
	nfd, _, errno := syscall.Syscall(sysPidfdGetfd, pidfd, uintptr(fd), 0)
	if errno != 0 {
		return nil, errno
	}
	return os.NewFile(nfd, "go command's stderr"), nil
}
