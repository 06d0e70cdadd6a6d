// Package clusters starts private replicated clusters of the servers the
// stores run on, on loopback, for the failover tests of this module:
//
//   - a three-node MariaDB Galera Cluster ([StartGalera]);
//   - a PostgreSQL primary with a streaming standby ([StartPostgres]);
//   - a Redis primary with a replica and a Sentinel ([StartRedis]);
//   - a Redis Cluster ([StartRedisCluster]).
//
// It also starts single servers that a test crashes
// and restarts ([StartSingle]). Library code never imports it.
//
// Every helper takes the test's testing.TB and starts its servers as child
// processes, each in its own process group, so that a kill takes its
// helpers with it. It stops them and removes their files in t.Cleanup,
// also when the test fails. A binary that is missing skips the test, or
// fails it when IDEMPOTENCY_REQUIRE_ALL=1.
//
// Replication links go through a [faultproxy.Proxy]. A test can then
// partition a replica from its primary (a lagging or partitioned replica)
// and close the link, losing what the primary sent meanwhile.
package clusters

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/conformance/faultproxy"
	"github.com/go-idempotency/idempotency/internal/testenv"
)

// need returns the path of each binary named: a name looked up in PATH and
// in dirs, or a list of candidate absolute paths separated by '|'. A
// missing one skips t, or fails it when IDEMPOTENCY_REQUIRE_ALL=1.
func need(t testing.TB, what string, names ...string) []string {
	t.Helper()
	var paths []string
	for _, name := range names {
		p, err := findBinary(name)
		if err != nil {
			if testenv.RequireAll() {
				t.Fatalf("%s needs %s, and %s=1: %v", what, name, testenv.RequireAllEnv, err)
			}
			t.Skipf("%s needs %s: %v", what, name, err)
		}
		paths = append(paths, p)
	}
	return paths
}

func findBinary(name string) (string, error) {
	if filepath.IsAbs(name) {
		if _, err := os.Stat(name); err != nil {
			return "", err
		}
		return name, nil
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found in PATH nor in /usr/sbin", name)
}

// firstExisting returns the first of paths that exists, or an error naming
// them all.
func firstExisting(paths ...string) (string, error) {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("none of %v exists", paths)
}

// account is a system user the servers run as.
type account struct {
	name     string
	uid, gid uint32
}

// lookupAccount returns the system user name the servers run as when the
// tests run as root, as PostgreSQL refuses to run as root. Otherwise the
// servers run as the current user (the zero account).
func lookupAccount(t testing.TB, what, name string) account {
	t.Helper()
	if os.Geteuid() != 0 {
		return account{}
	}
	u, err := user.Lookup(name)
	if err != nil {
		if testenv.RequireAll() {
			t.Fatalf("%s needs the system user %s, and %s=1: %v", what, name, testenv.RequireAllEnv, err)
		}
		t.Skipf("%s needs the system user %s: %v", what, name, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return account{name: name, uid: uint32(uid), gid: uint32(gid)}
}

// tempDir makes a directory readable by all, for the servers' own
// directories, and removes it in t.Cleanup, after the servers registered
// later have stopped.
func tempDir(t testing.TB, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			// The servers' logs say why, in CI too: show their ends.
			_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() && strings.HasSuffix(path, ".log") {
					t.Logf("%s:\n%s", path, tail(path, 1500))
				}
				return nil
			})
		}
		_ = os.RemoveAll(dir)
	})
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// mkdirOwned makes dir (mode perm) owned by acct.
func mkdirOwned(t testing.TB, dir string, perm os.FileMode, acct account) {
	t.Helper()
	if err := os.MkdirAll(dir, perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, perm); err != nil {
		t.Fatal(err)
	}
	if acct.name != "" {
		if err := os.Chown(dir, int(acct.uid), int(acct.gid)); err != nil {
			t.Fatal(err)
		}
	}
}

// writeOwned writes a file owned by acct.
func writeOwned(t testing.TB, path, content string, acct account) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if acct.name != "" {
		if err := os.Chown(path, int(acct.uid), int(acct.gid)); err != nil {
			t.Fatal(err)
		}
	}
}

// command builds a command in its own process group, run as acct when it
// is not the zero account.
func command(acct account, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	// Setpgid: a kill takes the server's own children too. Pdeathsig: a
	// test binary that dies (a panic, a timeout) takes its servers along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if acct.name != "" {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: acct.uid, Gid: acct.gid}
	}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if acct.name != "" {
		cmd.Env = append(cmd.Env, "HOME=/tmp", "USER="+acct.name, "LOGNAME="+acct.name)
	}
	return cmd
}

// runCmd runs a command to completion, bounded by d, and fails t with its
// output if it fails.
func runCmd(t testing.TB, d time.Duration, acct account, name string, args ...string) {
	t.Helper()
	cmd := command(acct, name, args...)
	done := make(chan struct{})
	timer := time.AfterFunc(d, func() {
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		close(done)
	})
	out, err := cmd.CombinedOutput()
	if !timer.Stop() {
		<-done
		t.Fatalf("%s %v: still running after %v\n%s", name, args, d, out)
	}
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// proc is a server process started by this package.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startProc starts cmd (built by command) with its output in logFile, and
// kills its process group in t.Cleanup.
func startProc(t testing.TB, name string, cmd *exec.Cmd, logFile string) *proc {
	t.Helper()
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	return p
}

// kill sends SIGKILL to the process group (the server and whatever it
// started) and waits for the server to exit. It is what a crash of the
// machine looks like to the other servers: no shutdown, nothing flushed to
// the replicas.
func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// replicationLink starts a [faultproxy.Proxy] to upstream, for a replica's
// connection to its primary, and returns it with its loopback port. It is
// closed in t.Cleanup.
func replicationLink(t testing.TB, upstream string) (*faultproxy.Proxy, int) {
	t.Helper()
	p, err := faultproxy.New(upstream, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	_, port, err := net.SplitHostPort(p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return p, n
}

// FreePort returns a TCP port that is free on loopback now. It is chosen
// at random below the kernel's ephemeral range (32768 and up by default),
// so an outgoing connection cannot take it before the server binds it.
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePorts(t, 1)[0]
}

// FreePorts returns n distinct ports, as [FreePort].
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			t.Fatalf("no %d free ports on loopback", n)
		}
		p := 20000 + mrand.IntN(12000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		held = append(held, l)
		ports = append(ports, p)
	}
	return ports
}

// waitFor polls ok every 50ms until it returns nil, or fails t with its
// last error after d. A process in procs that exits meanwhile fails t at
// once, with the tail of its log.
func waitFor(t testing.TB, d time.Duration, what string, ok func(ctx context.Context) error, procs ...*proc) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := ok(ctx)
		cancel()
		if err == nil {
			return
		}
		for _, p := range procs {
			if p.exited() {
				t.Fatalf("waiting for %s: %s exited: %v", what, p.name, p.err)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %v", d, what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tail returns the last n bytes of a log file, for failure messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

var errNotReady = errors.New("not ready")
