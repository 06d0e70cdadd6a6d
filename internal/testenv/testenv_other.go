//go:build !linux

package testenv

import (
	"errors"
	"os"
)

// sharedFD is available on Linux only.
func sharedFD(pid, fd int) (*os.File, error) {
	return nil, errors.New("testenv: sharing a parent's file descriptor needs Linux")
}
