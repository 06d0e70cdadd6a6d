package main

import (
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestScopeRequired: inspect, list and forget refuse a command line
// without -scope, saying so (they used the empty scope silently, and
// answered "no record" or an empty page for a key of another scope); a
// -scope given empty names the empty scope.
func TestScopeRequired(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 60*time.Second)
	sc := newStoreCase(t, ctx, "sqlite")
	if _, err := sc.seed.complete(ctx, idempotency.Key{ID: "k-empty"}, "x", false); err != nil {
		t.Fatal(err)
	}
	cmd := func(args ...string) (int, string, string) {
		return runCmd(t, ctx, append(append([]string{}, sc.args...), args...)...)
	}
	for _, args := range [][]string{{"inspect", "k-empty"}, {"list"}, {"forget", "k-empty"}, {"inspect", "-body", "k-empty"}} {
		code, out, errs := cmd(args...)
		want := "idemctl: " + args[0] + ": -scope is required: a key lives in one scope (the account your service names with it); give -scope '' for the empty scope\n"
		if code != exitUsage || out != "" || errs != want {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 and %q", args, code, out, errs, want)
		}
	}
	if code, out, errs := cmd("inspect", "-scope", "", "k-empty"); code != 0 || !strings.Contains(out, "state:       completed\n") {
		t.Errorf("inspect -scope '': exit %d (%s):\n%s", code, errs, out)
	}
	if code, out, errs := cmd("list", "-scope="); code != 0 || !strings.Contains(out, "k-empty") {
		t.Errorf("list -scope=: exit %d (%s):\n%s", code, errs, out)
	}
	if code, out, errs := cmd("forget", "k-empty", "-scope", ""); code != 0 || !strings.Contains(out, nextRuns) {
		t.Errorf("forget -scope '': exit %d (%s):\n%s", code, errs, out)
	}
}
