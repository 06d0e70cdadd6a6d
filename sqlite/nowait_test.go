package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestNoWaitOtherKeyBusy: while a caller of one key holds the Store's one
// writer, callers with NoWait of other keys are told at once that the
// store is busy (ErrStore), neither that their key is in progress (it is
// not held) nor a conflict (the core would retry it); a NoWait caller of
// the held key gets ErrInProgress at once. Once the holder is done, the
// same keys go through.
func TestNoWaitOtherKeyBusy(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 0)
	release := hold(t, f, idempotency.Key{ID: "held"})
	const n = 10
	errs := make([]error, n+1)
	took := make([]time.Duration, n+1)
	testkit.Together(n+1, func(i int) {
		key := idempotency.Key{ID: fmt.Sprint("other", i)}
		if i == n {
			key.ID = "held"
		}
		r := reservation(key, time.Now(), 0)
		r.NoWait = true
		start := time.Now()
		txn, rec, err := f.store.Reserve(ctx, r)
		took[i] = time.Since(start)
		if txn != nil || rec != nil {
			err = fmt.Errorf("got txn %v, record %v: want an error", txn, rec)
			if txn != nil {
				_ = txn.Rollback(context.Background())
			}
		}
		errs[i] = err
	})
	for i, err := range errs {
		if took[i] > 2*time.Second {
			t.Errorf("caller %d: answered after %v, want at once", i, took[i])
		}
		if i == n {
			if !errors.Is(err, idempotency.ErrInProgress) || errors.Is(err, idempotency.ErrStore) {
				t.Errorf("NoWait caller of the held key: got %v, want ErrInProgress", err)
			}
			continue
		}
		if !errors.Is(err, idempotency.ErrStore) || errors.Is(err, idempotency.ErrInProgress) || errors.Is(err, backend.ErrConflict) {
			t.Errorf("NoWait caller %d of another key: got %v, want ErrStore alone", i, err)
		}
	}
	release()
	for i := range n {
		r := reservation(idempotency.Key{ID: fmt.Sprint("other", i)}, time.Now(), 0)
		r.NoWait = true
		txn, _, err := f.store.Reserve(ctx, r)
		if err != nil || txn == nil {
			t.Fatalf("caller %d after the holder is done: %v", i, err)
		}
		if err := txn.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNoWaitDo: the same through Guard.Do with a negative WaitTimeout: tenant B's
// new key, met while tenant A's call holds the writer, fails at once with
// ErrStore and without running fn; retried once A is done, it runs once.
func TestNoWaitDo(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 0)
	g := guard(t, f.store, &idempotency.Config{WaitTimeout: -1})
	entered, release := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		_, err := g.Do(ctx, idempotency.Key{Scope: "A", ID: "a-1"}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
			close(entered)
			<-release
			return idempotency.Response{Status: 201}, f.fx.Effect(ctx, tx, "A")
		})
		aDone <- err
	}()
	<-entered
	b := idempotency.Key{Scope: "B", ID: "b-1"}
	fnB := func(tx *sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201}, f.fx.Effect(ctx, tx, "B")
	}
	start := time.Now()
	_, err := g.Do(ctx, b, "fp", fnB)
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("B answered after %v, want at once", took)
	}
	if !errors.Is(err, idempotency.ErrStore) || errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("B while A holds the writer: got %v, want ErrStore", err)
	}
	if c, err := f.fx.Count(ctx, "B"); err != nil || c != 0 {
		t.Fatalf("B's effects: %d, %v; want 0", c, err)
	}
	close(release)
	if err := <-aDone; err != nil {
		t.Fatalf("A: %v", err)
	}
	if r, err := g.Do(ctx, b, "fp", fnB); err != nil || r.Replayed {
		t.Fatalf("B retried after A: %+v, %v; want executed", r, err)
	}
	for _, tag := range []string{"A", "B"} {
		if c, err := f.fx.Count(ctx, tag); err != nil || c != 1 {
			t.Fatalf("%s's effects: %d, %v; want 1", tag, c, err)
		}
	}
}

// TestWaitingCallerGetsWriteTurn: a caller without NoWait (the core's
// first try: Wait 0) of another key waits for the write turn while a key is
// held and gets its reservation once the holder is done.
func TestWaitingCallerGetsWriteTurn(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 0)
	release := hold(t, f, idempotency.Key{ID: "held"})
	time.AfterFunc(200*time.Millisecond, release)
	start := time.Now()
	txn, _, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: "other"}, time.Now(), 0))
	if err != nil || txn == nil {
		t.Fatalf("other key, Wait 0, holder done after 200ms: %v; want a reservation", err)
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Errorf("reserved after %v, before the holder was done", took)
	}
	if err := txn.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
}
