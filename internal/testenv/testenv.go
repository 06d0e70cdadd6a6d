// Package testenv finds the servers that tests run against. Library code
// never imports it, and it imports only the standard library, so that the
// module's requirement graph holds no test infrastructure.
//
// Each server comes from an environment variable. When the variable is unset
// the test is skipped with a message naming the variable, or fails when
// IDEMPOTENCY_REQUIRE_ALL=1. On a machine with Docker, the nested module
// internal/devservers starts the three servers and prints the variables to
// export:
//
//	go run -C internal/devservers .
//
// A package whose tests use this package calls [Main] from its TestMain.
// Then go test says, once per package and without -v, which backends were
// not run and how to enable them.
package testenv

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// Environment variables read by this package.
const (
	PostgresEnv   = "IDEMPOTENCY_POSTGRES_DSN"
	MySQLEnv      = "IDEMPOTENCY_MYSQL_DSN"
	RedisEnv      = "IDEMPOTENCY_REDIS_ADDR"
	NATSEnv       = "IDEMPOTENCY_NATS_URL"
	AMQPEnv       = "IDEMPOTENCY_AMQP_URL"
	RequireAllEnv = "IDEMPOTENCY_REQUIRE_ALL"
)

// Backend names a server that tests may run against.
type Backend string

// The servers this package knows about.
const (
	Postgres Backend = "PostgreSQL"
	MySQL    Backend = "MySQL/MariaDB"
	Redis    Backend = "Redis"
	NATS     Backend = "NATS"
	AMQP     Backend = "RabbitMQ"
)

// Env returns the environment variable that gives b's address, or "" for
// an unknown backend.
func (b Backend) Env() string {
	switch b {
	case Postgres:
		return PostgresEnv
	case MySQL:
		return MySQLEnv
	case Redis:
		return RedisEnv
	case NATS:
		return NATSEnv
	case AMQP:
		return AMQPEnv
	}
	return ""
}

// example returns a value of b's variable that matches the servers of the
// "Testing against real servers" in docs/backends.md.
func (b Backend) example() string {
	switch b {
	case Postgres:
		return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	case MySQL:
		return "root@tcp(127.0.0.1:3306)/test"
	case Redis:
		return "127.0.0.1:6379"
	case NATS:
		return "nats://127.0.0.1:4222"
	case AMQP:
		return "amqp://guest:guest@127.0.0.1:5672/"
	}
	return ""
}

// PostgresDSN returns a PostgreSQL DSN (pgx URL or keyword form).
func PostgresDSN(t testing.TB) string { t.Helper(); return lookup(t, Postgres) }

// MySQLDSN returns a go-sql-driver/mysql DSN.
func MySQLDSN(t testing.TB) string { t.Helper(); return lookup(t, MySQL) }

// RedisAddr returns a Redis address (host:port).
func RedisAddr(t testing.TB) string { t.Helper(); return lookup(t, Redis) }

// NATSURL returns a NATS server URL (nats://host:port).
func NATSURL(t testing.TB) string { t.Helper(); return lookup(t, NATS) }

// AMQPURL returns an AMQP 0-9-1 URL (amqp://user:pass@host:port/vhost).
func AMQPURL(t testing.TB) string { t.Helper(); return lookup(t, AMQP) }

// RequireAll reports whether IDEMPOTENCY_REQUIRE_ALL=1: a server that is not
// configured then fails the test instead of skipping it.
func RequireAll() bool { return os.Getenv(RequireAllEnv) == "1" }

// lookup returns b's variable, or skips t (fails it under RequireAll) with
// a message naming the variable.
func lookup(t testing.TB, b Backend) string {
	t.Helper()
	env := b.Env()
	if v := os.Getenv(env); v != "" {
		return v
	}
	msg := fmt.Sprintf("%s is not set: %s tests need a server (e.g. %s=%q; see docs/backends.md, \"Testing against real servers\")",
		env, b, env, b.example())
	if RequireAll() {
		t.Fatalf("%s, and %s=1 requires every backend", msg, RequireAllEnv)
	}
	t.Skip(msg)
	return ""
}

// Main runs the tests of a package that uses the given backends (all of
// PostgreSQL, MySQL and Redis when none are given) and exits with their
// status. Call it from the package's TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m, testenv.Postgres) }
//
// Before the tests start it prints one line naming the backends whose
// variable is unset, whose tests will therefore be skipped, and the
// variables that enable them. Under IDEMPOTENCY_REQUIRE_ALL=1 it says that
// those tests will fail instead. It prints nothing when every backend is
// configured.
//
// Without -v, go test discards the output of a passing package. So the
// line goes where the person running the tests sees it:
//
//   - with -v, to the test's output;
//   - otherwise to the go command's own standard error, when that is a
//     terminal, a pipe or a regular file such as a CI log (Linux);
//   - else to the terminal (/dev/tty);
//   - else to the test's output.
func Main(m *testing.M, backends ...Backend) {
	flag.Parse()
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".test")
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Path != "" {
		name = strings.TrimPrefix(strings.TrimSuffix(bi.Path, ".test"), "github.com/go-idempotency/idempotency/")
	}
	var line strings.Builder
	if report(&line, name, os.Getenv, backends) {
		w, closeW := userOutput(testing.Verbose())
		_, _ = io.WriteString(w, line.String())
		closeW()
	}
	os.Exit(m.Run())
}

// userOutput returns where Main's line goes, and a function that releases
// it.
func userOutput(verbose bool) (io.Writer, func()) {
	if verbose {
		return os.Stdout, func() {}
	}
	// The go command that runs this test binary (its parent) buffers our
	// output; its own stderr is the user's terminal or log. Opening it again
	// is safe for a terminal or a pipe, not for a regular file (our offset
	// would not be the go command's).
	// A regular file (a CI log, or go test's output redirected to a file)
	// is written through a duplicate of the go command's own descriptor.
	// So the line and the go command's output share one file offset.
	parent := fmt.Sprintf("/proc/%d/", os.Getppid())
	if exe, err := os.Readlink(parent + "exe"); err == nil && strings.TrimSuffix(filepath.Base(exe), ".exe") == "go" {
		if fi, err := os.Stat(parent + "fd/2"); err == nil {
			switch {
			case fi.Mode()&(os.ModeNamedPipe|os.ModeCharDevice|os.ModeSocket) != 0:
				if f, err := os.OpenFile(parent+"fd/2", os.O_WRONLY|os.O_APPEND, 0); err == nil {
					return f, func() { _ = f.Close() }
				}
			case fi.Mode().IsRegular():
				if f, err := sharedFD(os.Getppid(), 2); err == nil {
					return f, func() { _ = f.Close() }
				}
			}
		}
	}
	if f, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		return f, func() { _ = f.Close() }
	}
	return os.Stdout, func() {}
}

// report writes to w the line [Main] prints for the test binary name,
// reading variables with getenv, and reports whether it wrote one.
func report(w io.Writer, name string, getenv func(string) string, backends []Backend) bool {
	if len(backends) == 0 {
		backends = []Backend{Postgres, MySQL, Redis}
	}
	var missing []string
	for _, b := range backends {
		if getenv(b.Env()) == "" {
			missing = append(missing, fmt.Sprintf("%s (set %s)", b, b.Env()))
		}
	}
	if len(missing) == 0 {
		return false
	}
	if getenv(RequireAllEnv) == "1" {
		fmt.Fprintf(w, "testenv: %s: %s not configured, and %s=1: those tests FAIL\n",
			name, strings.Join(missing, ", "), RequireAllEnv)
		return true
	}
	fmt.Fprintf(w, "testenv: %s: NOT RUN (skipped): %s tests; see docs/backends.md, \"Testing against real servers\"\n",
		name, strings.Join(missing, ", "))
	return true
}
