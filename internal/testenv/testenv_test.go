package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestReport(t *testing.T) {
	env := func(m map[string]string) func(string) string {
		return func(k string) string { return m[k] }
	}
	for _, tc := range []struct {
		name     string
		vars     map[string]string
		backends []Backend
		want     string
	}{
		{
			name: "all set",
			vars: map[string]string{PostgresEnv: "x", MySQLEnv: "y", RedisEnv: "z"},
			want: "",
		},
		{
			name: "none set, default backends",
			vars: nil,
			want: `testenv: pkg: NOT RUN (skipped): PostgreSQL (set IDEMPOTENCY_POSTGRES_DSN), MySQL/MariaDB (set IDEMPOTENCY_MYSQL_DSN), Redis (set IDEMPOTENCY_REDIS_ADDR) tests; see docs/backends.md, "Testing against real servers"` + "\n",
		},
		{
			name:     "only the package's backends",
			vars:     map[string]string{PostgresEnv: "x"},
			backends: []Backend{Postgres, Redis},
			want:     `testenv: pkg: NOT RUN (skipped): Redis (set IDEMPOTENCY_REDIS_ADDR) tests; see docs/backends.md, "Testing against real servers"` + "\n",
		},
		{
			name:     "required",
			vars:     map[string]string{RequireAllEnv: "1"},
			backends: []Backend{NATS, AMQP},
			want:     "testenv: pkg: NATS (set IDEMPOTENCY_NATS_URL), RabbitMQ (set IDEMPOTENCY_AMQP_URL) not configured, and IDEMPOTENCY_REQUIRE_ALL=1: those tests FAIL\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			wrote := report(&b, "pkg", env(tc.vars), tc.backends)
			if got := b.String(); got != tc.want || wrote != (tc.want != "") {
				t.Errorf("report wrote %v:\n%q\nwant:\n%q", wrote, got, tc.want)
			}
		})
	}
}

func TestEnvNames(t *testing.T) {
	for b, want := range map[Backend]string{
		Postgres: "IDEMPOTENCY_POSTGRES_DSN", MySQL: "IDEMPOTENCY_MYSQL_DSN", Redis: "IDEMPOTENCY_REDIS_ADDR",
		NATS: "IDEMPOTENCY_NATS_URL", AMQP: "IDEMPOTENCY_AMQP_URL", "Oracle": "",
	} {
		if got := b.Env(); got != want {
			t.Errorf("%s.Env() = %q, want %q", b, got, want)
		}
	}
}

// TestLookup runs this test binary again as a child so that the skip and
// the failure of lookup can be observed from outside.
func TestLookup(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") == "1" {
		t.Logf("got %q", RedisAddr(t))
		return
	}
	for _, tc := range []struct {
		name string
		env  []string
		want []string // substrings of the child's output
		fail bool
	}{
		{"set", []string{RedisEnv + "=10.0.0.1:6379"}, []string{`got "10.0.0.1:6379"`, "--- PASS"}, false},
		{"unset", []string{RedisEnv + "="}, []string{"--- SKIP", "IDEMPOTENCY_REDIS_ADDR is not set"}, false},
		{"required", []string{RedisEnv + "=", RequireAllEnv + "=1"}, []string{"--- FAIL", "IDEMPOTENCY_REDIS_ADDR is not set", "IDEMPOTENCY_REQUIRE_ALL=1 requires every backend"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestLookup$", "-test.v")
			cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", RequireAllEnv+"=")
			cmd.Env = append(cmd.Env, tc.env...)
			out, err := cmd.CombinedOutput()
			if failed := err != nil; failed != tc.fail {
				t.Errorf("child failed: %v, want %v (%v)", failed, tc.fail, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("child output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// TestMainLine runs `go test` on a package that calls Main, as a user
// would, and checks that the line is in what the go command shows, with
// and without -v, and that nothing is printed when every backend is set.
func TestMainLine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a test binary")
	}
	const line = `testenv: internal/testenv/testdata/probe: NOT RUN (skipped): Redis (set IDEMPOTENCY_REDIS_ADDR) tests; see docs/backends.md, "Testing against real servers"`
	for _, tc := range []struct {
		name   string
		toFile bool // go test's output redirected to a regular file, as CI logs are
		args   []string
		env    []string
		want   []string
		absent []string
	}{
		{"plain", false, nil, []string{RedisEnv + "="}, []string{line + "\n", "ok  \tgithub.com/go-idempotency/idempotency/internal/testenv/testdata/probe"}, []string{"--- SKIP"}},
		{"to a file", true, nil, []string{RedisEnv + "="}, []string{line + "\n", "ok  \tgithub.com/go-idempotency/idempotency/internal/testenv/testdata/probe"}, []string{"--- SKIP"}},
		{"verbose", false, []string{"-v"}, []string{RedisEnv + "="}, []string{line + "\n", "--- SKIP: TestRedis"}, nil},
		{"all set", false, nil, []string{RedisEnv + "=127.0.0.1:1"}, []string{"ok  \t"}, []string{"testenv:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"test", "-count=1"}, tc.args...)
			cmd := exec.CommandContext(t.Context(), "go", append(args, "./testdata/probe")...)
			cmd.Env = append(os.Environ(), PostgresEnv+"=postgres://x", RequireAllEnv+"=")
			cmd.Env = append(cmd.Env, tc.env...)
			out, err := run(t, cmd, tc.toFile)
			if err != nil {
				t.Fatalf("go test: %v\n%s", err, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(string(out), a) {
					t.Errorf("output has %q:\n%s", a, out)
				}
			}
			if n := strings.Count(string(out), "testenv:"); n > 1 {
				t.Errorf("the line is printed %d times:\n%s", n, out)
			}
		})
	}
}

// run runs cmd with its standard output and error together, through a pipe
// or, with toFile, into a regular file opened as a shell's `>` opens it
// (truncated, no O_APPEND), and returns what it wrote.
func run(t *testing.T, cmd *exec.Cmd, toFile bool) ([]byte, error) {
	if !toFile {
		return cmd.CombinedOutput()
	}
	name := filepath.Join(t.TempDir(), "log")
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	err = cmd.Run()
	if cerr := f.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	out, rerr := os.ReadFile(name)
	if rerr != nil {
		t.Fatal(rerr)
	}
	return out, err
}
