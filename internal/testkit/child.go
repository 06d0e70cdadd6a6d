package testkit

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"
)

// StartChild starts this test binary again, running no test, with env (a
// "NAME=value" entry) added to its environment. The child's TestMain or
// init sees env and plays its part (a process to kill at a chosen point).
// Its standard error is the parent's; its standard output is returned, for
// [WaitForLine]. The caller kills and waits for the child.
func StartChild(t testing.TB, ctx context.Context, env string) (*exec.Cmd, io.Reader) {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// WaitForLine reports whether r yields the line want within d. The rest of
// r is read and dropped in the background until it ends, so that a writer
// never blocks on it.
func WaitForLine(r io.Reader, want string, d time.Duration) bool {
	found := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if sc.Text() == want {
				found <- true
				break
			}
		}
		close(found)
		for sc.Scan() {
		}
	}()
	select {
	case ok := <-found:
		return ok
	case <-time.After(d):
		return false
	}
}

// Run runs c to its end with its standard output and error captured, and
// returns its exit code and both. A command that could not run (not one
// that exited with a code) fails t.
func Run(t testing.TB, c *exec.Cmd) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		if _, ok := errors.AsType[*exec.ExitError](err); !ok {
			t.Fatal(err)
		}
	}
	return c.ProcessState.ExitCode(), out.String(), errb.String()
}
