package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	sqlitestore "github.com/go-idempotency/idempotency/sqlite"
)

// TestRandomCancels cancels many calls of Do at random moments, from
// before the reservation to after the commit. Every call either succeeds
// with its effect committed once, or fails with context.Canceled in its
// error chain and nothing committed; never another error.
func TestRandomCancels(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 0)
	g := guard(t, f.store, nil)
	do := func(ctx context.Context, id string) error {
		_, err := g.Do(ctx, idempotency.Key{ID: id}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte(id)}, f.fx.Effect(ctx, tx, id)
		})
		return err
	}
	// A call's usual duration on this machine, to spread the cancels over it.
	var ds []time.Duration
	for i := range 11 {
		start := time.Now()
		if err := do(ctx, fmt.Sprint("warm", i)); err != nil {
			t.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	typical := ds[len(ds)/2]

	const calls, workers = 600, 4
	ok := make([]bool, calls)
	var mu sync.Mutex
	var bad []string
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < calls && ctx.Err() == nil; i += workers {
				cctx, cancel := context.WithCancel(ctx)
				// The calls of the workers queue for the one writer.
				timer := time.AfterFunc(rand.N(2*workers*typical), cancel)
				err := do(cctx, fmt.Sprint("c", i))
				timer.Stop()
				cancel()
				ok[i] = err == nil
				if err != nil && !errors.Is(err, context.Canceled) {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("call %d: %v", i, err))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatal("the test ran out of time")
	}
	for _, b := range bad {
		t.Error(b, "; want context.Canceled in the chain")
	}
	effects := map[string]int{}
	rows, err := f.db.QueryContext(ctx, `SELECT tag, count(*) FROM "`+f.effects+`" GROUP BY tag`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var tag string
		var n int
		if err := rows.Scan(&tag, &n); err != nil {
			t.Fatal(err)
		}
		effects[tag] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	succeeded := 0
	for i, o := range ok {
		want := 0
		if o {
			want = 1
			succeeded++
		}
		if got := effects[fmt.Sprint("c", i)]; got != want {
			t.Errorf("call %d (succeeded %v): %d effects, want %d", i, o, got, want)
		}
	}
	t.Logf("%d of %d calls succeeded before their cancel (typical call %v)", succeeded, calls, typical)
}

// TestCompleteCancelledBeforeCommit: ctx ends after Complete's UPDATE and
// before its COMMIT, and database/sql rolls the transaction back on its own
// first (it then reports only sql.ErrTxDone from Commit). Complete's error
// still has context.Canceled in its chain, and nothing is committed.
func TestCompleteCancelledBeforeCommit(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	var n counter
	db := sql.OpenDB(countingConnector(t, filepath.Join(t.TempDir(), "cancel.db")+"?"+sqlitestore.DSNOptions, &n))
	f := newFixture(t, db, 1)
	key := idempotency.Key{ID: "k"}
	// One ctx for the whole call, as Guard.Do uses it: the transaction
	// began under it, so database/sql watches it.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	txn, _, err := f.store.Reserve(cctx, reservation(key, time.Now(), 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.fx.Effect(cctx, txn.Tx(), "x"); err != nil {
		t.Fatal(err)
	}
	n.setHook(func(name string) {
		if name == "exec complete done" { // the completing UPDATE ran
			cancel()
			// Let database/sql's watcher of ctx mark the transaction done;
			// it then waits for the UPDATE to return before rolling back.
			time.Sleep(50 * time.Millisecond)
		}
	})
	err = txn.Complete(cctx, idempotency.Response{Status: 200})
	n.setHook(nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Complete cancelled before its COMMIT: got %v, want context.Canceled in the chain", err)
	}
	if c, err := f.fx.Count(ctx, "x"); err != nil || c != 0 {
		t.Fatalf("effects: %d, %v; want 0", c, err)
	}
	if txn, _, err := f.store.Reserve(ctx, reservation(key, time.Now(), 0)); err != nil || txn == nil {
		t.Fatalf("the key after the cancelled Complete: %v; want it free", err)
	} else if err := txn.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
}
