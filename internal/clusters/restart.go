package clusters

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Kind names a server [StartSingle] can start.
type Kind string

// The servers [StartSingle] can start.
const (
	KindPostgres Kind = "postgres"
	KindMariaDB  Kind = "mariadb"
	KindRedis    Kind = "redis"
)

// Single is one private server on loopback that a test can crash and
// start again on the same port, with the same data directory. That is a
// restart as an operator or a machine reboot would do it.
type Single struct {
	// Kind is the server's kind.
	Kind Kind
	// Port is its loopback port.
	Port int

	t       testing.TB
	dir     string
	acct    account
	start   func() *proc
	ready   func(ctx context.Context) error
	mu      sync.Mutex
	current *proc
}

// StartSingle starts a server of kind k on a loopback port found free at
// run time, configured for durable commits, and waits until it accepts
// connections:
//
//   - PostgreSQL: initdb (trust authentication for user postgres, database
//     test), fsync and synchronous_commit on (the defaults), run as the
//     system user postgres;
//   - MariaDB: mariadb-install-db (root without a password, database test),
//     innodb_flush_log_at_trx_commit=1 (the default: the redo log is
//     flushed at every commit), run as the system user mysql;
//   - Redis: appendonly yes with appendfsync always, so that a write is on
//     disk before Redis answers it, and no RDB snapshots.
//
// It is killed and its files removed in t.Cleanup. A missing binary skips
// t, or fails it when IDEMPOTENCY_REQUIRE_ALL=1.
func StartSingle(t testing.TB, k Kind) *Single {
	t.Helper()
	s := &Single{Kind: k, t: t}
	switch k {
	case KindPostgres:
		s.setupPostgres()
	case KindMariaDB:
		s.setupMariaDB()
	case KindRedis:
		s.setupRedis()
	default:
		t.Fatalf("clusters: unknown server kind %q", k)
	}
	s.mu.Lock()
	s.current = s.start()
	s.mu.Unlock()
	waitFor(t, 60*time.Second, string(k)+" to accept connections", s.ready, s.current)
	return s
}

// Addr is the server's address, host:port.
func (s *Single) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// Crash kills the server and everything it started with SIGKILL: nothing
// is flushed or shut down cleanly.
func (s *Single) Crash() {
	s.mu.Lock()
	p := s.current
	s.mu.Unlock()
	p.kill()
}

// Start starts the server again after [Single.Crash], on the same port and
// data, and waits until it accepts connections (after its crash recovery).
func (s *Single) Start() {
	s.t.Helper()
	s.mu.Lock()
	s.current = s.start()
	p := s.current
	s.mu.Unlock()
	waitFor(s.t, 60*time.Second, string(s.Kind)+" to accept connections again", s.ready, p)
}

func (s *Single) setupPostgres() {
	t := s.t
	const what = "the PostgreSQL restart test"
	bin := postgresBin(t, what)
	s.acct = lookupAccount(t, what, "postgres")
	s.Port = FreePort(t)
	s.dir = tempDir(t, "idem-restart-pg-")
	mkdirOwned(t, filepath.Join(s.dir, "sock"), 0o755, s.acct)
	data := filepath.Join(s.dir, "data")
	mkdirOwned(t, data, 0o700, s.acct)
	runCmd(t, time.Minute, s.acct, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C")
	appendFile(t, filepath.Join(data, "postgresql.conf"), "listen_addresses = '127.0.0.1'\n"+
		"unix_socket_directories = '"+filepath.Join(s.dir, "sock")+"'\n"+
		"shared_buffers = 32MB\nmax_connections = 40\nlogging_collector = off\n"+
		"fsync = on\nsynchronous_commit = on\nfull_page_writes = on\n")
	s.start = func() *proc {
		cmd := command(s.acct, filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(s.Port))
		return startProc(t, "postgres", cmd, filepath.Join(s.dir, "postgres.log"))
	}
	created := false
	s.ready = func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, dsn(s.Port, "postgres"))
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		if !created {
			if _, err := conn.Exec(ctx, "CREATE DATABASE test"); err != nil {
				return err
			}
			created = true
		}
		return nil
	}
}

// PostgresDSN is a pgx URL of database test on a PostgreSQL Single.
func (s *Single) PostgresDSN() string { return dsn(s.Port, "test") }

func (s *Single) setupMariaDB() {
	t := s.t
	const what = "the MariaDB restart test"
	bins := need(t, what, "mariadbd", "mariadb-install-db")
	s.acct = lookupAccount(t, what, "mysql")
	s.Port = FreePort(t)
	s.dir = tempDir(t, "idem-restart-mariadb-")
	data := filepath.Join(s.dir, "data")
	mkdirOwned(t, data, 0o750, s.acct)
	run := filepath.Join(s.dir, "run") // the socket, pid and log: written by the server's user
	mkdirOwned(t, run, 0o755, s.acct)
	userLine := ""
	if s.acct.name != "" {
		userLine = "user=" + s.acct.name
	}
	cnf := filepath.Join(s.dir, "my.cnf")
	writeOwned(t, cnf, fmt.Sprintf(`[mysqld]
datadir=%[1]s/data
socket=%[1]s/run/mysqld.sock
pid-file=%[1]s/run/mysqld.pid
log-error=%[1]s/run/error.log
port=%[2]d
bind-address=127.0.0.1
%[3]s
skip-name-resolve
skip-log-bin
default_storage_engine=InnoDB
innodb_buffer_pool_size=64M
innodb_log_file_size=16M
innodb_flush_log_at_trx_commit=1
max_connections=100
`, s.dir, s.Port, userLine), s.acct)
	args := []string{"--defaults-file=" + cnf, "--auth-root-authentication-method=normal", "--skip-test-db"}
	if s.acct.name != "" {
		args = append(args, "--user="+s.acct.name)
	}
	runCmd(t, 2*time.Minute, account{}, bins[1], args...)
	s.start = func() *proc {
		return startProc(t, "mariadbd", command(account{}, bins[0], "--defaults-file="+cnf), filepath.Join(s.dir, "stdout.log"))
	}
	s.ready = func(ctx context.Context) error {
		db, err := sql.Open("mysql", "root@tcp("+s.Addr()+")/")
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS test")
		return err
	}
}

// MySQLDSN is a go-sql-driver/mysql DSN of database test on a MariaDB
// Single, with the options the mysql store recommends.
func (s *Single) MySQLDSN() string {
	return "root@tcp(" + s.Addr() + ")/test?interpolateParams=true&innodb_lock_wait_timeout=30&timeout=2s"
}

func (s *Single) setupRedis() {
	t := s.t
	bins := need(t, "the Redis restart test", "redis-server")
	s.Port = FreePort(t)
	s.dir = tempDir(t, "idem-restart-redis-")
	s.start = func() *proc {
		return startRedisServer(t, bins[0], s.dir, "single", s.Port, "--appendonly", "yes", "--appendfsync", "always")
	}
	s.ready = pingRedis(s.Addr())
}
