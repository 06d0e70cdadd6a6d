package conformance_test

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/conformance"
)

// catalogueEnv names the catalogue entry TestCatalogueInner runs the suite
// on; only TestCatalogue sets it.
const catalogueEnv = "CONFORMANCE_CATALOGUE"

// entry is one deliberately broken store of the catalogue, and what the
// suite must say about it.
type entry struct {
	name string
	// suite runs conformance.Run on the broken store.
	suite func(t *testing.T)
	// run is the cases to run: the one that must fail and happy paths
	// that must pass.
	run string
	// mustFail is the case that must fail; empty when the failure is the
	// run's own (a report that came after its case ended).
	mustFail string
	// mustPass are cases the broken store passes: the suite tells it
	// apart by mustFail alone.
	mustPass []string
	// mustSay, if set, must appear in the output.
	mustSay string
}

func revSuite(m mistakes) func(t *testing.T) {
	return func(t *testing.T) { conformance.Run(t, revHarness(m)) }
}

// catalogue lists one broken store per mistake the suite must catch: the
// mistakes of a third-party etcd store that an earlier suite passed, and
// the ones it already caught.
func catalogue() []entry {
	happy := []string{"ConcurrentSameKey", "ErrorRollsBack"}
	return []entry{
		// Two effects for one key in 1 of 40 rounds of 8 callers on 8
		// Guards; one Guard queues its callers in memory and never shows it
		// (ConcurrentSameKey, on four Guards, now fails it too).
		{name: "blind-reserve", suite: revSuite(mistakes{blindReserve: true}),
			run: "ErrorRollsBack|TTLExpiry|RacingReserves", mustFail: "RacingReserves", mustPass: []string{"ErrorRollsBack", "TTLExpiry"}},
		{name: "takeover-without-cas", suite: revSuite(mistakes{takeoverNoCAS: true}),
			run: "ConcurrentSameKey|ErrorRollsBack|LeaseRunsOut|LeaseTakeover", mustFail: "LeaseTakeover",
			mustPass: append(happy, "LeaseRunsOut")},
		{name: "stale-rollback-frees", suite: revSuite(mistakes{staleRollback: true}),
			run: "ConcurrentSameKey|ErrorRollsBack|LeaseStaleComplete|LeaseStaleRollback", mustFail: "LeaseStaleRollback",
			mustPass: append(happy, "LeaseStaleComplete")},
		{name: "waiter-ignores-lease", suite: revSuite(mistakes{waiterIgnoresLease: true}),
			run: "ConcurrentSameKey|ErrorRollsBack|LeaseTakeover", mustFail: "LeaseTakeover", mustPass: happy,
			mustSay: "a waiter must wake when the lease runs out"},
		{name: "lease-lost-as-plain-error", suite: revSuite(mistakes{lostAsPlain: true}),
			run: "ConcurrentSameKey|ErrorRollsBack|LeaseRunsOut|LeaseStaleComplete", mustFail: "LeaseStaleComplete",
			mustPass: append(happy, "LeaseRunsOut")},
		{name: "stale-complete-applies", suite: revSuite(mistakes{noOwnerCheck: true}),
			run: "ConcurrentSameKey|ErrorRollsBack|TTLExpiry|LeaseRunsOut", mustFail: "LeaseRunsOut",
			mustPass: append(happy, "TTLExpiry")},
		{name: "purge-without-recheck", suite: revSuite(mistakes{purgeNoRecheck: true}),
			run: "Purge|PurgeLimit|PurgeRecheck", mustFail: "PurgeRecheck", mustPass: []string{"Purge", "PurgeLimit"}},
		{name: "purge-ignores-limit", suite: revSuite(mistakes{purgeIgnoresLimit: true}),
			run: "Purge|PurgeRecheck|PurgeLimit", mustFail: "PurgeLimit", mustPass: []string{"Purge", "PurgeRecheck"}},
		{name: "purge-counts-chosen", suite: revSuite(mistakes{purgeCountsChosen: true}),
			run: "Purge|PurgeLimit|PurgeCountsDeleted", mustFail: "PurgeCountsDeleted",
			mustPass: []string{"Purge", "PurgeLimit"}},
		{name: "failed-complete-holds", suite: revSuite(mistakes{failedHolds: true}),
			run: "ConcurrentSameKey|ErrorRollsBack|CompleteWithCancelledContext|FailedCompleteFreesKey", mustFail: "FailedCompleteFreesKey",
			mustPass: append(happy, "CompleteWithCancelledContext")},
		// The mistakes of a third-party store that an earlier suite
		// passed: a Purge whose delete re-checks only that the key is not
		// held (one round trip per delete, so the window is small); a hold
		// judged by the holder's clock against the reader's; a hold with
		// no lease, taken over only by a waiter that watched it for a
		// lease; records that never expire without a test clock; a coarse
		// expiry rounded down; a stale phase that still commits; and quota
		// counters read then written, counting replays, counting refusals.
		{name: "purge-checks-held-only", suite: revSuite(mistakes{purgeHeldOnly: true}),
			run: "Purge|PurgeLimit|PurgeRecheck", mustFail: "PurgeRecheck", mustPass: []string{"Purge", "PurgeLimit"}},
		{name: "hold-by-host-clocks", suite: revSuite(mistakes{hostLease: true}),
			run: "ConcurrentSameKey|ErrorRollsBack|LeaseTakeover|HostClocksDiffer", mustFail: "HostClocksDiffer",
			mustPass: append(happy, "LeaseTakeover")},
		{name: "hold-without-lease", suite: revSuite(mistakes{noLeaseOnHold: true}),
			run: "ConcurrentSameKey|ErrorRollsBack|LeaseTakeover|LeaseHolderDies", mustFail: "LeaseHolderDies",
			mustPass: append(happy, "LeaseTakeover")},
		{name: "no-expiry-without-test-clock", suite: revSuite(mistakes{noClockNoExpiry: true}),
			run: "ConcurrentSameKey|ErrorRollsBack|TTLExpiry|TTLExpiryStoreClock", mustFail: "TTLExpiryStoreClock",
			mustPass: append(happy, "TTLExpiry")},
		{name: "coarse-expiry-rounded-down", suite: func(t *testing.T) { conformance.Run(t, revHarnessWith(mistakes{roundDown: true}, coarseFeatures)) },
			run: "ConcurrentSameKey|ErrorRollsBack|LeaseTakeover|TTLExpiryStoreClock", mustFail: "TTLExpiryStoreClock",
			mustPass: append(happy, "LeaseTakeover")},
		{name: "stale-step-commits", suite: staleStepSuite,
			run: "ConcurrentSameKey|ErrorRollsBack|StepsNewKey|StepsHoldRunsOutMidStep", mustFail: "StepsHoldRunsOutMidStep",
			mustPass: append(happy, "StepsNewKey")},
		{name: "quota-read-then-write", suite: quotaSuite(quotaMistakes{readThenWrite: true}),
			run: "ErrorRollsBack|QuotaReplayFree|QuotaRefusedNotCounted|QuotaAtomic", mustFail: "QuotaAtomic",
			mustPass: []string{"ErrorRollsBack", "QuotaReplayFree", "QuotaRefusedNotCounted"}},
		{name: "quota-counts-replays", suite: quotaSuite(quotaMistakes{countsReplays: true}),
			run: "ErrorRollsBack|QuotaAtomic|QuotaRefusedNotCounted|QuotaReplayFree", mustFail: "QuotaReplayFree",
			mustPass: []string{"ErrorRollsBack", "QuotaAtomic", "QuotaRefusedNotCounted"}},
		{name: "quota-counts-refused", suite: quotaSuite(quotaMistakes{countsRefused: true}),
			run: "ErrorRollsBack|QuotaAtomic|QuotaReplayFree|QuotaRefusedNotCounted", mustFail: "QuotaRefusedNotCounted",
			mustPass: []string{"ErrorRollsBack", "QuotaReplayFree"}},
		// The key reserved by one committed statement, the effect
		// committed by a second, the key completed by a third.
		{name: "two-transactions", suite: func(t *testing.T) { conformance.Run(t, twoTxHarness()) },
			run: "ConcurrentSameKey|ErrorRollsBack|TTLExpiry|CompleteWithCancelledContext|CompleteInterrupted", mustFail: "CompleteInterrupted",
			mustPass: append(happy, "TTLExpiry", "CompleteWithCancelledContext")},
		// The holder's transaction rolled back under it and Do runs its fn
		// again: the case fails and names it, without a panic.
		{name: "holder-runs-again", suite: heldAgainSuite, run: "ErrorRollsBack|WaiterGetsReplay", mustFail: "WaiterGetsReplay",
			mustPass: []string{"ErrorRollsBack"}, mustSay: "fn ran again after it held the key"},
		// A store that reports to its t from a goroutine after the case
		// ended: the run fails and says so, and later cases still run.
		{name: "reports-after-the-case", suite: lateSuite, run: "ErrorRollsBack|TTLExpiry",
			mustPass: []string{"ErrorRollsBack", "TTLExpiry"}, mustSay: "after the case ended"},
		// A Reserve that ignores its ctx and never returns: the case fails,
		// and the next case runs.
		{name: "hung-call", suite: hungSuite, run: "NoWait|ErrorRollsBack", mustFail: "NoWait",
			mustPass: []string{"ErrorRollsBack"}, mustSay: "ignores its ctx"},
	}
}

// TestCatalogueInner runs the suite on one broken store of the catalogue.
// It runs only in the subprocesses of TestCatalogue, which expect it to
// fail.
func TestCatalogueInner(t *testing.T) {
	name := os.Getenv(catalogueEnv)
	if name == "" {
		t.Skip("runs only inside TestCatalogue")
	}
	for _, c := range catalogue() {
		if c.name == name {
			c.suite(t)
			return
		}
	}
	t.Fatalf("unknown %s=%q", catalogueEnv, name)
}

// TestCatalogue shows conformance.Run failing every broken store of the
// catalogue in the case made for its mistake, while it passes their happy
// paths, without a panic; the same store without mistakes passes the whole
// suite (TestRevStoreConformance). Each entry runs in a subprocess of its
// own, since a failing suite fails its test.
func TestCatalogue(t *testing.T) {
	if os.Getenv(catalogueEnv) != "" {
		t.Skip("inside a catalogue run")
	}
	t.Parallel() // with TestRevStoreConformance: both mostly wait
	// The runs mostly wait (leases, bounds): six at once, more than the
	// -parallel default of GOMAXPROCS would allow, the slowest started
	// first.
	entries := catalogue()
	type run struct {
		out     []byte
		err     error
		timeout bool
	}
	runs := make([]chan run, len(entries))
	sem := make(chan struct{}, 6)
	for i := range runs {
		runs[i] = make(chan run, 1)
	}
	for i := len(entries) - 1; i >= 0; i-- { // the slowest are last in the list
		c := entries[i]
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestCatalogueInner$/^("+c.run+")$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), catalogueEnv+"="+c.name)
			out, err := cmd.CombinedOutput()
			runs[i] <- run{out, err, ctx.Err() != nil}
		}()
	}
	for i, c := range entries {
		t.Run(c.name, func(t *testing.T) {
			r := <-runs[i]
			err, text := r.err, string(r.out)
			switch {
			case r.timeout:
				t.Fatalf("the suite on %s did not finish within 90s:\n%s", c.name, text)
			case strings.Contains(text, "panic:"):
				t.Fatalf("the suite on %s panicked, want a failing case:\n%s", c.name, text)
			case err == nil:
				t.Fatalf("the suite PASSED %s; want %s to fail:\n%s", c.name, cmp(c.mustFail, "the run"), text)
			case c.mustFail != "" && !strings.Contains(text, "--- FAIL: TestCatalogueInner/"+c.mustFail+" "):
				t.Fatalf("the suite failed %s, but not in %s:\n%s", c.name, c.mustFail, text)
			case c.mustSay != "" && !strings.Contains(text, c.mustSay):
				t.Fatalf("the suite failed %s without saying %q:\n%s", c.name, c.mustSay, text)
			}
			for _, p := range c.mustPass {
				if !strings.Contains(text, "--- PASS: TestCatalogueInner/"+p+" ") {
					t.Fatalf("%s should pass %s (the suite must tell it apart by %s alone):\n%s", c.name, p, cmp(c.mustFail, "its report"), text)
				}
			}
			for _, line := range strings.Split(text, "\n") {
				if strings.Contains(line, "contract:") || strings.Contains(line, "cases_") || strings.Contains(line, "conformance:") {
					t.Log(strings.TrimSpace(line))
				}
			}
		})
	}
}

func cmp(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// heldAgainSuite runs the suite on conflictOnceStore over SQLite.
func heldAgainSuite(t *testing.T) {
	conformance.Run(t, conformance.Harness[*sql.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*sql.Tx] {
			f := newFixture(t, opts)
			f.Store = &conflictOnceStore{KeyStore: f.Store, seen: map[idempotency.Key]bool{}}
			return f
		},
		Features: conformance.Features{SerialWriters: true},
	})
}

// lateSuite runs the suite on the correct rev store, whose fixture reports
// a failure from a goroutine 100ms after its case ended.
func lateSuite(t *testing.T) {
	h := revHarness(mistakes{})
	inner := h.NewFixture
	h.NewFixture = func(t testing.TB, opts conformance.Options) conformance.Fixture[*revTx] {
		ended := make(chan struct{})
		t.Cleanup(func() { close(ended) })
		go func() {
			<-ended
			time.Sleep(100 * time.Millisecond)
			t.Errorf("rev store: a watch fired after its case ended")
		}()
		return inner(t, opts)
	}
	conformance.Run(t, h)
	time.Sleep(300 * time.Millisecond) // the last case's late report comes while t lives
}

// hungStore never returns from a Reserve with NoWait: it ignores its ctx.
type hungStore struct{ *revStore }

func (s hungStore) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*revTx], *backend.Record, error) {
	if r.NoWait {
		select {} //nolint:staticcheck // the point: a call that never returns
	}
	return s.revStore.Reserve(ctx, r)
}

func hungSuite(t *testing.T) {
	h := revHarness(mistakes{})
	inner := h.NewFixture
	h.NewFixture = func(t testing.TB, opts conformance.Options) conformance.Fixture[*revTx] {
		f := inner(t, opts)
		f.Store = hungStore{f.Store.(*revStore)}
		return f
	}
	conformance.Run(t, conformance.Harness[*revTx](h))
}
