package mysql

import (
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	gomysql "github.com/go-sql-driver/mysql"
)

// TestConflictInFnRetried: a deadlock met by fn's own statement is retried
// by Do (the store classifies it), so the caller gets the response and the
// effect commits once; other errors from fn come back as they are.
func TestConflictInFnRetried(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	f := newFixture(t, openDB(t, testConfig(t, nil), 2), nil)
	g, err := idempotency.New(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	resp, err := g.Do(ctx, idempotency.Key{ID: testkit.Name("idem_test_")}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
		if err := f.fx.Effect(ctx, tx, "pay"); err != nil {
			return idempotency.Response{}, err
		}
		if calls++; calls == 1 {
			// What a real deadlock returns from tx.ExecContext.
			return idempotency.Response{}, fmt.Errorf("charge: %w", &gomysql.MySQLError{Number: 1213, Message: "Deadlock found"})
		}
		return idempotency.Response{Status: 201}, nil
	})
	if err != nil || resp.Status != 201 || calls != 2 {
		t.Fatalf("got %+v, %v after %d calls; want 201 after 2", resp, err, calls)
	}
	testkit.MustCount(t, ctx, f.fx.Count, "pay", 1)
	_, err = g.Do(ctx, idempotency.Key{ID: testkit.Name("idem_test_")}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
		_, err := tx.ExecContext(ctx, "SELECT * FROM no_such_table_here")
		return idempotency.Response{}, err
	})
	var me *gomysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1146 || errors.Is(err, backend.ErrConflict) {
		t.Fatalf("missing table in fn: got %v, want the 1146 error itself", err)
	}
}
