package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/testkit"
)

// asMainEnv makes the test binary run main (TestMain).
const asMainEnv = "IDEMCTL_TEST_AS_MAIN"

// planted is the password of every DSN of plantedDSNs.
const planted = "Pl4nted-S3cret"

// plantedDSNs are -store values with planted as the password, for each
// scheme and each kind of mistake: refused before connecting, a server
// that refuses the password, a server that cannot be reached.
func plantedDSNs() []string {
	p := planted
	return []string{
		"postgres://postgres:" + p + "@127.0.0.1:5432/test?sslmode=disable", // trust: accepted
		"postgresql://nosuchrole:" + p + "@127.0.0.1:5432/test?sslmode=disable",
		"postgres://postgres:" + p + "@127.0.0.1:1/test?sslmode=disable&connect_timeout=2",
		"postgres://postgres:" + p + "@127.0.0.1:5432/test?sslmode=bogus",
		"postgres://postgres@127.0.0.1:5432/test?sslmode=disable&password=" + p,
		"mysql://root:" + p + "@127.0.0.1:3306/test",
		"root:" + p + "@tcp(127.0.0.1:3306)/test",
		"root:" + p + "@tcp(127.0.0.1:1)/test?timeout=2s",
		"root:" + p + "@tcp(127.0.0.1:3306/test",
		"root:" + p + "@127.0.0.1:3306/test",
		"mysql://root:" + p + "@[::1/test",
		"redis://default:" + p + "@127.0.0.1:6379/0",
		"redis://:" + p + "@127.0.0.1:1/0?dial_timeout=2s",
		"rediss://u:" + p + "@127.0.0.1:6379/0?dial_timeout=2s",
		"redis://u:" + p + "@[::1/0",
		"redis://u:" + p + "@127.0.0.1:6379/notadb",
	}
}

// plantedArgs are the command lines run with each DSN: every command, a
// mistyped flag, a missing -scope, -h, and -store given after the command
// or as -store=DSN.
func plantedArgs(dsn string) [][]string {
	g := []string{"-store", dsn, "-timeout", "5s"}
	with := func(args ...string) []string { return append(append([]string{}, g...), args...) }
	return [][]string{
		with("inspect", "-scope", "s", "k"),
		with("inspect", "-body", "-scope", "s", "k"),
		with("inspect", "-bogus", "k"),
		with("inspect", "k"),
		with("list", "-scope", "s"),
		with("list", "-scope", "s", "-limit", "x"),
		with("forget", "-scope", "s", "k"),
		with("stats"),
		with("purge", "-dry-run"),
		with("purge"),
		with("frobnicate"),
		with("inspect", "-h"),
		{"inspect", "-scope", "s", "-store", dsn, "k"},
		{"-store=" + dsn, "stats", "-bogus"},
		{"--store", dsn},
	}
}

// TestNoSecretPrinted: no command line of idemctl, whatever its mistake,
// prints the -store password, on stdout or stderr, for any store scheme;
// a failure's message is printed once.
func TestNoSecretPrinted(t *testing.T) {
	t.Parallel()
	for _, dsn := range plantedDSNs() {
		for _, args := range plantedArgs(dsn) {
			ctx := testkit.Context(t, 30*time.Second)
			code, out, errs := runCmd(t, ctx, args...)
			checkOutput(t, args, code, out, errs)
		}
	}
}

// checkOutput fails t if the output of idemctl args holds the planted
// password, or a failure's "idemctl:" line more than once.
func checkOutput(t *testing.T, args []string, code int, out, errs string) {
	t.Helper()
	if strings.Contains(out+errs, planted) {
		t.Errorf("%q (exit %d) printed the password:\nstdout:\n%s\nstderr:\n%s", args, code, out, errs)
	}
	if n := strings.Count(errs, "idemctl:"); code != 0 && n != 1 {
		t.Errorf("%q (exit %d): %d error lines, want 1:\n%s", args, code, n, errs)
	}
	if code == 0 && errs != "" && !strings.HasPrefix(errs, "Usage:") {
		t.Errorf("%q: exit 0 with stderr:\n%s", args, errs)
	}
	if errs != "" && strings.Contains(errs, "flag provided but not defined: -bogus\nUsage") {
		t.Errorf("%q: the flag package's own message is printed:\n%s", args, errs)
	}
}

// TestNoSecretPrintedProcess runs idemctl as a process, so that anything a
// library writes to the process's own stderr (a driver's logger) is seen
// too.
func TestNoSecretPrintedProcess(t *testing.T) {
	t.Parallel()
	for _, dsn := range plantedDSNs() {
		for _, args := range [][]string{
			{"-store", dsn, "-timeout", "5s", "inspect", "-scope", "s", "k"},
			{"-store", dsn, "inspect", "-bogus", "k"},
		} {
			ctx := testkit.Context(t, 30*time.Second)
			code, out, errs := runProcess(t, ctx, args...)
			checkOutput(t, args, code, out, errs)
		}
	}
}

// runProcess runs the test binary as idemctl with args.
func runProcess(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	c := exec.CommandContext(ctx, os.Args[0], args...)
	c.Env = append(os.Environ(), asMainEnv+"=1")
	return testkit.Run(t, c)
}

// TestFlagErrorOnce: a mistyped flag prints its error once, then the
// usage, whose -store shows no password.
func TestFlagErrorOnce(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 30*time.Second)
	dsn := "mysql://root:" + planted + "@127.0.0.1:3306/test"
	code, out, errs := runCmd(t, ctx, "-store", dsn, "inspect", "-bogus", "k")
	want := "idemctl: flag provided but not defined: -bogus\n\nUsage: idemctl -store DSN"
	if code != exitUsage || out != "" || !strings.HasPrefix(errs, want) || strings.Count(errs, "-bogus") != 1 {
		t.Errorf("exit %d, stdout %q, stderr:\n%s\nwant 2 and a stderr starting %q, -bogus once", code, out, errs, want)
	}
}
