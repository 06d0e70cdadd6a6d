package clusters

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// reapScript is run by sh with the test binary's end of a pipe as stdin and
// the servers' PIDs as arguments. It waits for a line: "done" (the test
// ended and its own cleanup stops the servers) ends it; end of file (the
// test binary died: a panic in a goroutine, a timeout, a signal, none of
// which runs t.Cleanup) makes it kill each server's process group, then
// the server itself, with SIGKILL.
const reapScript = `read -r line
[ "$line" = done ] && exit 0
for pid in "$@"; do
	kill -KILL -- "-$pid" 2>/dev/null
	kill -KILL "$pid" 2>/dev/null
done
exit 0`

// reapOnExit makes sure that the servers of procs do not outlive the test
// binary. Their own t.Cleanup kills them when the test ends; but a panic in
// a goroutine (or the test timeout, or a signal) ends the binary without
// running any cleanup, and Pdeathsig does not help: a server that starts
// as root and switches to its own user (mariadbd's user=mysql) loses it
// with the change of credentials. So a small watcher process of its own
// (its own process group, so that a signal to the test's group does not
// take it along) holds the read end of a pipe that only this binary can
// write to: end of file means the binary is gone, and the watcher kills
// the servers by the PIDs this test started. t.Cleanup tells it to exit
// and waits for it.
func reapOnExit(t testing.TB, procs ...*proc) {
	t.Helper()
	var args []string
	for _, p := range procs {
		args = append(args, strconv.Itoa(p.cmd.Process.Pid))
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", append([]string{"-c", reapScript, "idempotency-ha-reaper"}, args...)...)
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = r.Close()
		_ = w.Close()
		t.Fatalf("start the watcher that kills the servers if the test binary dies: %v", err)
	}
	_ = r.Close() // the watcher has its own copy; w stays open until cleanup
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_, _ = fmt.Fprintln(w, "done")
		_ = w.Close()
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
}

// reapChildEnv makes TestGaleraReaper's subprocess play the dying binary.
const reapChildEnv = "IDEMPOTENCY_HA_REAP_CHILD"

// TestGaleraReaper runs a test binary that starts a server stand-in
// (sleep, without Pdeathsig, as mariadbd is once it changed user) with
// reapOnExit, and then panics in a goroutine, which runs no t.Cleanup: the
// stand-in must be gone soon after.
func TestGaleraReaper(t *testing.T) {
	if os.Getenv(reapChildEnv) != "" {
		cmd := command(account{}, "sleep", "300")
		cmd.SysProcAttr.Pdeathsig = 0
		p := startProc(t, "sleep", cmd, os.DevNull)
		reapOnExit(t, p)
		fmt.Printf("server pid=%d\n", p.cmd.Process.Pid)
		go func() { panic("a panic in a goroutine: the binary dies without running t.Cleanup") }()
		time.Sleep(time.Minute)
		t.Fatal("still alive after the panic")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestGaleraReaper$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), reapChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !bytes.Contains(out, []byte("panic: a panic in a goroutine")) {
		t.Fatalf("the child binary should have died of its panic: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`server pid=(\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no server pid in the child's output:\n%s", out)
	}
	pid, _ := strconv.Atoi(string(m[1]))
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the server (pid %d) outlived its test binary by 10s", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether pid is a running process (a zombie, killed but not
// yet reaped by its new parent, is not).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z'
}
