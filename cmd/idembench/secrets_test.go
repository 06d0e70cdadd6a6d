package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
)

// planted is the password of the servers' DSNs of TestNoSecretPrinted.
const planted = "Pl4nted-S3cret"

// leakTool is a fakeTool whose benchmarks print the servers' DSNs, as a
// fixture's failure might, on their output and their stderr.
type leakTool struct {
	fakeTool
	dsns []string
}

func (l *leakTool) run(ctx context.Context, bin binary, args []string, echo, stderr io.Writer) ([]byte, error) {
	out, _ := l.fakeTool.run(ctx, bin, args, echo, stderr)
	for _, dsn := range l.dsns {
		fmt.Fprintf(stderr, "fixture: cannot connect to %s\n", dsn)
		out = append(out, fmt.Sprintf("--- FAIL: BenchmarkStore\n    connect %q: refused\n", dsn)...)
	}
	return out, fmt.Errorf("exit status 1 (%s)", l.dsns[0])
}

// TestNoSecretPrinted: idembench never prints the password of a server
// DSN it runs the benchmarks with, whether a benchmark prints it (on its
// output, shown in the failure's tail and with -v, or on its stderr) or a
// flag is mistyped.
func TestNoSecretPrinted(t *testing.T) {
	dsns := []string{
		"postgres://postgres:" + planted + "@127.0.0.1:5432/test?sslmode=disable",
		"root:" + planted + "@tcp(127.0.0.1:3306)/test",
		"redis://default:" + planted + "@127.0.0.1:6379/0",
	}
	t.Setenv("IDEMPOTENCY_POSTGRES_DSN", dsns[0])
	t.Setenv("IDEMPOTENCY_MYSQL_DSN", dsns[1])
	t.Setenv("IDEMPOTENCY_REDIS_ADDR", dsns[2])
	for _, args := range [][]string{
		{"-pkgs", "a", "-rounds", "1", "-v"},
		{"-pkgs", "a", "-rounds", "1", "-markdown"},
		{"-bogus"},
		{"-h"},
		{"-rounds", "0"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, nil, &out, &errb, &leakTool{dsns: dsns})
		if strings.Contains(out.String()+errb.String(), planted) {
			t.Errorf("%q (exit %d) printed the password:\nstdout:\n%s\nstderr:\n%s", args, code, out.String(), errb.String())
		}
		if args[0] == "-pkgs" && (code != 1 || !strings.Contains(errb.String(), "fixture: cannot connect to postgres://postgres:xxxxx@127.0.0.1")) {
			t.Errorf("%q: exit %d, stderr:\n%s\nwant 1 and the redacted DSN", args, code, errb.String())
		}
	}
}
