package postgres_test

import (
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// TestTxBehaviour: the pgx.Tx fn receives works like pgx's own inside fn
// (statements, batches, COPY, prepared statements, savepoints), returns an
// error from Commit, is closed once Do returns, and a transaction fn left
// aborted fails Do with pgx.ErrTxCommitRollback.
func TestTxBehaviour(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newFixture(t, newPool(t, 2), postgres.Config{})
	g := f.guard(t, nil)
	insert := "INSERT INTO " + f.effects + " (tag) VALUES ($1)"

	var kept, keptSavepoint pgx.Tx
	_, err := g.Do(ctx, idempotency.Key{ID: "full"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		kept = tx
		if _, err := tx.Exec(ctx, insert, "exec"); err != nil {
			return idempotency.Response{}, err
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+f.effects+" WHERE tag = 'exec'").Scan(&n); err != nil || n != 1 {
			return idempotency.Response{}, errors.New("QueryRow does not see the transaction's own insert")
		}
		rows, err := tx.Query(ctx, "SELECT tag FROM "+f.effects)
		if err != nil {
			return idempotency.Response{}, err
		}
		tags, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(tags) != 1 {
			return idempotency.Response{}, errors.Join(errors.New("Query"), err)
		}
		b := &pgx.Batch{}
		b.Queue(insert, "batch")
		b.Queue(insert, "batch")
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return idempotency.Response{}, err
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{f.effects}, []string{"tag"}, pgx.CopyFromRows([][]any{{"copy"}, {"copy"}, {"copy"}})); err != nil {
			return idempotency.Response{}, err
		}
		if _, err := tx.Prepare(ctx, "ins", insert); err != nil {
			return idempotency.Response{}, err
		}
		if _, err := tx.Exec(ctx, "ins", "prepared"); err != nil {
			return idempotency.Response{}, err
		}
		if _, err := tx.Conn().Exec(ctx, insert, "conn"); err != nil {
			return idempotency.Response{}, err
		}
		// A savepoint rolled back discards only its own work...
		sp, err := tx.Begin(ctx)
		if err != nil {
			return idempotency.Response{}, err
		}
		if _, err := sp.Exec(ctx, insert, "undone"); err != nil {
			return idempotency.Response{}, err
		}
		if err := sp.Rollback(ctx); err != nil {
			return idempotency.Response{}, err
		}
		// ...one released keeps it, even after a failed statement inside.
		sp, err = tx.Begin(ctx)
		if err != nil {
			return idempotency.Response{}, err
		}
		inner, err := sp.Begin(ctx)
		if err != nil {
			return idempotency.Response{}, err
		}
		if _, err := inner.Exec(ctx, "SELECT 1/0"); err == nil {
			return idempotency.Response{}, errors.New("1/0 did not fail")
		}
		if err := inner.Rollback(ctx); err != nil {
			return idempotency.Response{}, err
		}
		if _, err := sp.Exec(ctx, insert, "savepoint"); err != nil {
			return idempotency.Response{}, err
		}
		if err := sp.Commit(ctx); err != nil {
			return idempotency.Response{}, err
		}
		keptSavepoint, err = tx.Begin(ctx)
		if err != nil {
			return idempotency.Response{}, err
		}
		if err := tx.Commit(ctx); err == nil {
			return idempotency.Response{}, errors.New("Commit inside fn succeeded, want an error")
		}
		return idempotency.Response{Status: http.StatusCreated}, nil
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	for tag, want := range map[string]int{"exec": 1, "batch": 2, "copy": 3, "prepared": 1, "conn": 1, "undone": 0, "savepoint": 1} {
		testkit.MustCount(t, ctx, f.count, tag, want)
	}
	for name, tx := range map[string]pgx.Tx{"tx": kept, "savepoint": keptSavepoint} {
		closedErrs := map[string]error{}
		_, closedErrs["Exec"] = tx.Exec(ctx, insert, "late")
		_, closedErrs["Query"] = tx.Query(ctx, "SELECT 1")
		closedErrs["QueryRow"] = tx.QueryRow(ctx, "SELECT 1").Scan(new(int))
		closedErrs["SendBatch"] = tx.SendBatch(ctx, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: "SELECT 1"}}}).Close()
		_, closedErrs["CopyFrom"] = tx.CopyFrom(ctx, pgx.Identifier{f.effects}, []string{"tag"}, pgx.CopyFromRows([][]any{{"late"}}))
		_, closedErrs["Prepare"] = tx.Prepare(ctx, "late", "SELECT 1")
		_, closedErrs["Begin"] = tx.Begin(ctx)
		closedErrs["Commit"] = tx.Commit(ctx)
		for m, err := range closedErrs {
			if !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("%s.%s after Do returned: got %v, want pgx.ErrTxClosed", name, m, err)
			}
		}
	}
	testkit.MustCount(t, ctx, f.count, "late", 0)

	// fn that ignores a failed statement: the commit cannot happen, the key
	// stays free. (fn's own Commit and Rollback are conformance's FnEndsTx.)
	_, err = g.Do(ctx, idempotency.Key{ID: "aborted"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		if _, err := tx.Exec(ctx, insert, "aborted"); err != nil {
			return idempotency.Response{}, err
		}
		_, _ = tx.Exec(ctx, "SELECT 1/0")
		return idempotency.Response{Status: 200}, nil
	})
	if !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("fn ignored a failed statement: got %v, want pgx.ErrTxCommitRollback", err)
	}
	testkit.MustCount(t, ctx, f.count, "aborted", 0)
	r, err := g.Do(ctx, idempotency.Key{ID: "aborted"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 200}, f.effect(ctx, tx, "aborted")
	})
	if err != nil || r.Replayed {
		t.Fatalf("key after a failed attempt: got %+v, %v; want executed", r, err)
	}
	testkit.MustCount(t, ctx, f.count, "aborted", 1)
}

// TestConflictInFnRetried: a deadlock met by fn's own statement is retried
// by Do (the store classifies it), so the caller gets the response and the
// effect commits once.
func TestConflictInFnRetried(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newFixture(t, newPool(t, 2), postgres.Config{})
	g := f.guard(t, nil)
	var calls atomic.Int64
	resp, err := g.Do(ctx, idempotency.Key{ID: testkit.Name("k")}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		if err := f.effect(ctx, tx, "pay"); err != nil {
			return idempotency.Response{}, err
		}
		if calls.Add(1) == 1 {
			// What a real deadlock returns from tx.Exec.
			return idempotency.Response{}, fmt.Errorf("charge: %w", &pgconn.PgError{Code: "40P01", Message: "deadlock detected"})
		}
		return idempotency.Response{Status: 201}, nil
	})
	if err != nil || resp.Status != 201 || calls.Load() != 2 {
		t.Fatalf("got %+v, %v after %d calls; want 201 after 2", resp, err, calls.Load())
	}
	testkit.MustCount(t, ctx, f.count, "pay", 1)
	// Any other database error from fn is returned as it is.
	_, err = g.Do(ctx, idempotency.Key{ID: testkit.Name("k")}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		_, err := tx.Exec(ctx, "SELECT 1/0")
		return idempotency.Response{}, err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22012" || errors.Is(err, backend.ErrConflict) {
		t.Fatalf("division by zero in fn: got %v, want the 22012 error itself", err)
	}
}
