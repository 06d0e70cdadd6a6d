package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestExpiredTakeoverConcurrent: callers racing for an expired key run the
// effect once.
func TestExpiredTakeoverConcurrent(t *testing.T) {
	ctx := testkit.Context(t, 60*time.Second)
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	f := newFixture(t, openDB(t, testConfig(t, nil), 0), &Config{Clock: now})
	g, err := idempotency.New(f.store, &idempotency.Config{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	key := idempotency.Key{ID: testkit.Name("idem_test_")}
	var calls atomic.Int64
	fn := func(tx *sql.Tx) (idempotency.Response, error) {
		n := calls.Add(1)
		if err := f.fx.Effect(ctx, tx, "payment"); err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: 200, Body: fmt.Appendf(nil, "run %d", n)}, nil
	}
	if _, err := g.Do(ctx, key, "fp", fn); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	clock = clock.Add(time.Minute)
	mu.Unlock()
	const callers = 10
	resps := make([]idempotency.Response, callers)
	errs := make([]error, callers)
	testkit.Together(callers, func(i int) { resps[i], errs[i] = g.Do(ctx, key, "fp2", fn) })
	executed := 0
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if !resps[i].Replayed {
			executed++
		}
		if string(resps[i].Body) != "run 2" {
			t.Fatalf("caller %d: got %q, want the takeover's response", i, resps[i].Body)
		}
	}
	if executed != 1 {
		t.Fatalf("%d callers executed, want 1", executed)
	}
	testkit.MustCount(t, ctx, f.fx.Count, "payment", 2)
}

// TestPurgeSkipsHeldRows: Purge deletes expired rows, at most limit, and
// skips (never waits for) rows held by open transactions: a pending
// reservation and a takeover of an expired row.
func TestPurgeSkipsHeldRows(t *testing.T) {
	ctx := testkit.Context(t, 60*time.Second)
	clk := &testClock{}
	f := newFixture(t, openDB(t, testConfig(t, nil), 0), &Config{Clock: clk.Now})
	t0 := time.Now().Add(-24 * time.Hour)
	complete := func(id string, now time.Time) {
		t.Helper()
		clk.Set(now)
		txn, _, err := f.store.Reserve(ctx, backend.Reservation{Key: idempotency.Key{ID: id}, Fingerprint: "fp", TTL: time.Hour, Wait: time.Second})
		if err != nil || txn == nil {
			t.Fatalf("reserve %s: %v", id, err)
		}
		if err := txn.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 7 {
		complete(fmt.Sprint("old", i), t0)
	}
	complete("taken", t0)
	complete("live", time.Now())
	// Held: "taken" is being taken over, "pending" is a new reservation
	// whose expiry has passed already.
	clk.Set(t0.Add(2 * time.Hour))
	hold(t, ctx, f.store, idempotency.Key{ID: "taken"})
	clk.Set(t0)
	pendingTxn := hold(t, ctx, f.store, idempotency.Key{ID: "pending"})

	rows := func() int {
		var n int
		if err := f.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+f.table+"`").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	clk.Set(time.Now())
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second) // never waits for a held row
	defer cancel()
	if n, err := f.store.Purge(pctx, 3); err != nil || n != 3 {
		t.Fatalf("Purge(limit 3): got %d, %v; want 3", n, err)
	}
	if n, err := f.store.Purge(pctx, 100); err != nil || n != 4 {
		t.Fatalf("Purge(limit 100): got %d, %v; want the 4 other unheld expired rows", n, err)
	}
	if n, err := f.store.Purge(pctx, 0); err != nil || n != 0 {
		t.Fatalf("Purge(limit 0): got %d, %v", n, err)
	}
	if n := rows(); n != 2 { // "taken" and "live"; "pending" is not committed
		t.Fatalf("rows left: got %d, want 2", n)
	}
	if err := pendingTxn.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := f.store.Purge(pctx, 100); err != nil || n != 0 {
		t.Fatalf("Purge while \"taken\" is held: got %d, %v; want 0", n, err)
	}
}

// TestPurgeManyRows: a Purge batch larger than one DELETE (purgeChunk)
// deletes every unheld expired row of the batch, skips one that a takeover
// holds in the middle of the same scope without waiting for it, and counts
// exactly.
func TestPurgeManyRows(t *testing.T) {
	ctx := testkit.Context(t, 60*time.Second)
	f := newFixture(t, openDB(t, testConfig(t, nil), 0), nil)
	const rows = 2*purgeChunk + 100
	expired := time.Now().Add(-time.Hour)
	if err := f.fill(ctx, rows, expired); err != nil {
		t.Fatal(err)
	}
	// A takeover of one of the expired rows holds it.
	hold(t, ctx, f.store, idempotency.Key{Scope: "fill", ID: fmt.Sprintf("fill-%010d", purgeChunk+7)})
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second) // never waits for a held row
	defer cancel()
	if n, err := f.store.Purge(pctx, 1000); err != nil || n != rows-1 {
		t.Fatalf("Purge(limit 1000): got %d, %v; want %d", n, err, rows-1)
	}
	var left int
	if err := f.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+f.table+"`").Scan(&left); err != nil || left != 1 {
		t.Fatalf("rows left: got %d, %v; want the held one", left, err)
	}
}

// testClock is a settable clock for Config.Clock.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

// Now reads the clock.
func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set sets the clock.
func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}
