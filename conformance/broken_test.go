package conformance_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/conformance"
)

// brokenEnv selects the broken store TestBrokenStoreInner runs the suite
// on; it is set only by TestSuiteFailsBrokenStores.
const brokenEnv = "CONFORMANCE_BROKEN_STORE"

// TestBrokenStoreInner runs the suite on a deliberately broken store. It
// runs only in the subprocesses of TestSuiteFailsBrokenStores, which
// expect it to fail.
func TestBrokenStoreInner(t *testing.T) {
	switch os.Getenv(brokenEnv) {
	case "":
		t.Skip("runs only inside TestSuiteFailsBrokenStores")
	case "twotx":
		conformance.Run(t, twoTxHarness())
	case "lease":
		conformance.Run(t, leaseHarness(false))
	default:
		t.Fatalf("unknown %s=%q", brokenEnv, os.Getenv(brokenEnv))
	}
}

// TestSuiteFailsBrokenStores shows that conformance.Run fails a
// non-atomic store and a lease store that lets a stale owner complete,
// each in the case made for it, while their happy paths pass. (The
// correct stores, the sqlite package's and leaseStore with its owner
// check, pass: TestConformance, TestLeaseStoreConformance.)
func TestSuiteFailsBrokenStores(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("inside a broken-store run")
	}
	for _, c := range []struct {
		store    string
		run      string // the cases to run: the one that must fail, and happy paths that must pass
		mustFail string
		mustPass []string
	}{
		{"twotx", "ConcurrentSameKey|ErrorRollsBack|TTLExpiry|CompleteWithCancelledContext|CompleteInterrupted", "CompleteInterrupted",
			[]string{"ConcurrentSameKey", "ErrorRollsBack", "TTLExpiry", "CompleteWithCancelledContext"}},
		{"lease", "ConcurrentSameKey|ErrorRollsBack|TTLExpiry|LeaseRunsOut", "LeaseRunsOut",
			[]string{"ConcurrentSameKey", "ErrorRollsBack", "TTLExpiry"}},
	} {
		t.Run(c.store, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestBrokenStoreInner$/^("+c.run+")$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenEnv+"="+c.store)
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("the suite on the %s store did not finish within 50s:\n%s", c.store, out)
			}
			if err == nil {
				t.Fatalf("the suite PASSED the broken %s store; want %s to fail:\n%s", c.store, c.mustFail, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestBrokenStoreInner/"+c.mustFail+" ") {
				t.Fatalf("the suite failed the broken %s store, but not in %s:\n%s", c.store, c.mustFail, out)
			}
			for _, p := range c.mustPass {
				if !strings.Contains(string(out), "--- PASS: TestBrokenStoreInner/"+p+" ") {
					t.Fatalf("the broken %s store should pass the happy path %s (the suite must tell it apart by the atomicity case alone):\n%s", c.store, p, out)
				}
			}
			for _, line := range strings.Split(string(out), "\n") {
				if strings.Contains(line, c.mustFail) || strings.Contains(line, "contract:") || strings.Contains(line, "cases_") {
					t.Log(strings.TrimSpace(line))
				}
			}
		})
	}
}
