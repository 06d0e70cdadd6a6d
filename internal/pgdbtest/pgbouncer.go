package pgdbtest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/testenv"
)

// pgbouncerBin is where Debian's pgbouncer package installs the binary.
const pgbouncerBin = "/usr/sbin/pgbouncer"

// BouncerOptions configure a private PgBouncer.
type BouncerOptions struct {
	// PoolSize is default_pool_size: server connections per database and
	// user (4 when 0).
	PoolSize int
	// Lifetime is server_lifetime and server_idle_timeout in whole seconds
	// (1 when 0): server connections are closed and replaced that often.
	Lifetime int
	// ConnectQuery, if set, runs on every new server connection.
	ConnectQuery string
}

// StartPgBouncer starts a private PgBouncer in transaction pooling mode on a
// free loopback port, in front of the server of IDEMPOTENCY_POSTGRES_DSN, and
// returns the DSN of that DSN's database through it. Its configuration, log
// and files live in a temporary directory; it is stopped by its PID at
// cleanup. A missing binary skips the test, or fails it under
// IDEMPOTENCY_REQUIRE_ALL=1 (.ci/run installs Debian's pgbouncer package).
func StartPgBouncer(t testing.TB, o BouncerOptions) string {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	if _, err := os.Stat(pgbouncerBin); err != nil {
		if testenv.RequireAll() {
			t.Fatalf("%s: %v; IDEMPOTENCY_REQUIRE_ALL=1 requires PgBouncer (apt-get install -y pgbouncer)", pgbouncerBin, err)
		}
		t.Skipf("%s: %v (apt-get install -y pgbouncer)", pgbouncerBin, err)
	}
	up, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	if o.PoolSize <= 0 {
		o.PoolSize = 4
	}
	if o.Lifetime <= 0 {
		o.Lifetime = 1
	}
	// Not t.TempDir: its parent is private to this user, whom PgBouncer
	// may not be (see below).
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var args []string
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root: it switches to the postgres
		// user, which must be able to write its log in dir.
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgbouncer cannot run as root and there is no postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-u", "postgres")
	}
	db := up.ConnConfig.Database
	userName := up.ConnConfig.User
	users := filepath.Join(dir, "users.txt")
	if err := os.WriteFile(users, []byte(fmt.Sprintf("%q \"\"\n", userName)), 0o644); err != nil {
		t.Fatal(err)
	}
	target := fmt.Sprintf("host=%s port=%d dbname=%s", up.ConnConfig.Host, up.ConnConfig.Port, db)
	if o.ConnectQuery != "" {
		target += " connect_query='" + strings.ReplaceAll(o.ConnectQuery, "'", "''") + "'"
	}
	logfile := filepath.Join(dir, "pgbouncer.log")
	for attempt := 0; ; attempt++ {
		port := freePort(t)
		ini := fmt.Sprintf(`[databases]
%s = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
logfile = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 500
server_lifetime = %d
server_idle_timeout = %d
server_reset_query =
ignore_startup_parameters = extra_float_digits
`, db, target, port, users, logfile, o.PoolSize, o.Lifetime, o.Lifetime)
		cfgFile := filepath.Join(dir, "pgbouncer.ini")
		if err := os.WriteFile(cfgFile, []byte(ini), 0o644); err != nil {
			t.Fatal(err)
		}
		var out syncBuffer
		cmd := exec.Command(pgbouncerBin, append(args, cfgFile)...)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start pgbouncer: %v", err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if waitListening(addr, exited, 10*time.Second) {
			pid := cmd.Process.Pid
			t.Cleanup(func() { stopByPID(t, pid, exited) })
			return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", userName, addr, db)
		}
		_ = cmd.Process.Kill()
		<-exited
		logged, _ := os.ReadFile(logfile)
		if attempt == 2 {
			t.Fatalf("pgbouncer did not listen on %s:\n%s\n%s", addr, out.String(), logged)
		}
	}
}

// stopByPID ends the PgBouncer of pid (SIGTERM, then SIGKILL after 5s).
func stopByPID(t testing.TB, pid int, exited <-chan struct{}) {
	p, err := os.FindProcess(pid)
	if err != nil {
		return
	}
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Errorf("pgbouncer %d ignored SIGTERM for 5s: killed", pid)
		_ = p.Kill()
		<-exited
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitListening reports whether addr accepts connections within d, before
// the process signals exited.
func waitListening(addr string, exited <-chan struct{}, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		select {
		case <-exited:
			return false
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// syncBuffer is a bytes.Buffer safe for the two writers of a process.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
