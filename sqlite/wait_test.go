package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestWaitBoundDoesNotLeak: the reservation's busy timeout (the wait bound)
// is not what the caller's statements run with, nor what the pool's
// connection keeps afterwards.
func TestWaitBoundDoesNotLeak(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 1)
	g := guard(t, f.store, &idempotency.Config{WaitTimeout: -1})
	var inFn int
	_, err := g.Do(ctx, idempotency.Key{ID: "k"}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 200}, tx.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&inFn)
	})
	if err != nil {
		t.Fatal(err)
	}
	var after int
	if err := f.db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&after); err != nil {
		t.Fatal(err)
	}
	if inFn != 5000 || after != 5000 {
		t.Fatalf("busy_timeout inside fn %d, after Do %d; want the DSN's 5000 both", inFn, after)
	}
}

// TestCancelWhileWaitingLongBound: a caller waiting under a 30s bound
// returns with ctx's error as soon as ctx is cancelled, and its connection
// goes back to the pool.
func TestCancelWhileWaitingLongBound(t *testing.T) {
	f := openFixture(t, 2)
	key := idempotency.Key{ID: "k"}
	release := hold(t, f, key)
	ctx, cancel := context.WithCancel(testkit.Context(t, testTimeout))
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	txn, rec, err := f.store.Reserve(ctx, reservation(key, time.Now(), 30*time.Second))
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Reserve returned %v after its ctx was cancelled", took-200*time.Millisecond)
	}
	if !errors.Is(err, context.Canceled) || txn != nil || rec != nil {
		t.Fatalf("cancelled waiter: got %v, %v, %v; want context.Canceled", txn, rec, err)
	}
	if n := f.db.Stats().InUse; n != 1 {
		t.Fatalf("connections in use: got %d, want 1 (the holder's)", n)
	}
	release()
	// The waiter's connection kept its busy timeout.
	for range 2 {
		var bt int
		if err := f.db.QueryRowContext(testkit.Context(t, testTimeout), "PRAGMA busy_timeout").Scan(&bt); err != nil || bt != 5000 {
			t.Fatalf("busy_timeout: %d, %v; want 5000", bt, err)
		}
	}
}

// TestOtherKeyWaitsForWriter documents SerialWriters: while one key is held,
// a caller of another key waits for the write lock, gets ErrConflict (a busy
// database, never "key in progress") past its bound, and gets through once
// the holder commits.
func TestOtherKeyWaitsForWriter(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 0)
	release := hold(t, f, idempotency.Key{ID: "held"})
	other := idempotency.Key{ID: "other"}
	for _, wait := range []time.Duration{0, 100 * time.Millisecond} {
		_, _, err := f.store.Reserve(ctx, reservation(other, time.Now(), wait))
		if !errors.Is(err, backend.ErrConflict) || errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("other key, wait %v, while one is held: got %v, want ErrConflict only", wait, err)
		}
	}
	time.AfterFunc(100*time.Millisecond, release)
	txn, _, err := f.store.Reserve(ctx, reservation(other, time.Now(), 10*time.Second))
	if err != nil || txn == nil {
		t.Fatalf("other key after the holder commits: %v", err)
	}
	if err := txn.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
}
