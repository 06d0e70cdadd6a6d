package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/testkit"
)

// asMainEnv makes the test binary run main (TestMain).
const asMainEnv = "IDEMCHECK_TEST_AS_MAIN"

// planted is the password of every DSN of TestNoSecretPrinted.
const planted = "Pl4nted-S3cret"

// TestNoSecretPrinted: idemcheck never prints the -store password, for
// any scheme and any mistake (a mistyped flag, a malformed DSN, a server
// that refuses the password or cannot be reached), in-process and as a
// process; a failure's message is printed once.
func TestNoSecretPrinted(t *testing.T) {
	t.Parallel()
	p := planted
	for _, dsn := range []string{
		"postgres://nosuchrole:" + p + "@127.0.0.1:5432/test?sslmode=disable",
		"postgres://postgres:" + p + "@127.0.0.1:1/test?sslmode=disable&connect_timeout=2",
		"postgres://postgres:" + p + "@127.0.0.1:5432/test?sslmode=bogus",
		"mysql://root:" + p + "@127.0.0.1:3306/test",
		"root:" + p + "@tcp(127.0.0.1:3306)/test",
		"root:" + p + "@tcp(127.0.0.1:1)/test?timeout=2s",
		"root:" + p + "@tcp(127.0.0.1:3306/test",
		"root:" + p + "@127.0.0.1:3306/test",
		"redis://default:" + p + "@127.0.0.1:6379/0",
		"redis://:" + p + "@127.0.0.1:1/0?dial_timeout=2s",
		"redis://u:" + p + "@[::1/0",
	} {
		for _, args := range [][]string{
			{"-store", dsn, "-n", "2", "-timeout", "10s"},
			{"-store", dsn, "-bogus"},
			{"-store=" + dsn, "-n", "0"},
			{"-store", dsn, "-h"},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			var out, errb bytes.Buffer
			code := run(ctx, args, &out, &errb)
			cancel()
			checkOutput(t, args, code, out.String(), errb.String())
		}
		args := []string{"-store", dsn, "-n", "2", "-timeout", "10s"}
		code, out, errs := runProcess(t, args...)
		checkOutput(t, args, code, out, errs)
	}
}

// checkOutput fails t if the output of idemcheck args holds the planted
// password, or a failure's "idemcheck:" line more than once.
func checkOutput(t *testing.T, args []string, code int, out, errs string) {
	t.Helper()
	if strings.Contains(out+errs, planted) {
		t.Errorf("%q (exit %d) printed the password:\nstdout:\n%s\nstderr:\n%s", args, code, out, errs)
	}
	if n := strings.Count(errs, "idemcheck:"); code != 0 && n != 1 {
		t.Errorf("%q (exit %d): %d error lines, want 1:\n%s", args, code, n, errs)
	}
}

// runProcess runs the test binary as idemcheck with args.
func runProcess(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, os.Args[0], args...)
	c.Env = append(os.Environ(), asMainEnv+"=1")
	return testkit.Run(t, c)
}

// TestFlagErrorOnce: a mistyped flag prints its error once, then the
// usage.
func TestFlagErrorOnce(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"-bogus"}, &out, &errb)
	want := "idemcheck: flag provided but not defined: -bogus\n\nUsage: idemcheck [-store DSN]"
	if code != 2 || out.Len() != 0 || !strings.HasPrefix(errb.String(), want) || strings.Count(errb.String(), "-bogus") != 1 {
		t.Errorf("exit %d, stdout %q, stderr:\n%s\nwant 2 and a stderr starting %q, -bogus once", code, out.String(), errb.String(), want)
	}
}
