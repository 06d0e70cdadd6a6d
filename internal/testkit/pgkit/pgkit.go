// Package pgkit is the part of the test kit (see package testkit) that
// speaks to PostgreSQL, through pgx. It is a package of its own so that
// the tests that never touch PostgreSQL do not link pgx.
//
// It imports "testing", so only _test.go files may import it.
package pgkit

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// dropTimeout bounds the connection and the statements of a drop.
const dropTimeout = 10 * time.Second

// DropAtCleanup drops the tables named names (or the schemas, with kind
// "SCHEMA"), if they exist and with what depends on them (CASCADE), when t
// ends. It drops them on a connection of its own to dsn, since the test's
// pool may be closed or full by then. It reports a failed connection or
// drop as an error of t. The names go into the SQL as they are: quote them
// if they must be.
func DropAtCleanup(t testing.TB, dsn, kind string, names ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), dropTimeout)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("drop %s %q: %v", kind, names, err)
			return
		}
		defer conn.Close(context.WithoutCancel(ctx))
		for _, n := range names {
			if _, err := conn.Exec(ctx, "DROP "+kind+" IF EXISTS "+n+" CASCADE"); err != nil {
				t.Errorf("drop %s %s: %v", kind, n, err)
			}
		}
	})
}

// Rig is a PostgreSQL store on fresh tables: the keys table Keys and a
// table Rows of the test's own effects, both dropped when the test ends.
type Rig struct {
	Pool  *pgxpool.Pool
	Store *postgres.Store
	// Keys is the store's table, Rows the test's own table beside it.
	Keys, Rows string
}

// NewRig opens a pool on dsn (closed at cleanup), a postgres store on a
// keys table named prefix plus a random suffix, migrated, and creates the
// table Keys+"_"+rows with the given column definitions. Both tables are
// dropped when t ends.
func NewRig(t testing.TB, ctx context.Context, dsn, prefix, rows, columns string) Rig {
	t.Helper()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	r := Rig{Pool: pool, Keys: testkit.Name(prefix)}
	r.Rows = r.Keys + "_" + rows
	DropAtCleanup(t, dsn, "TABLE", r.Keys, r.Rows)
	if r.Store, err = postgres.New(pool, &postgres.Config{Table: r.Keys}); err != nil {
		t.Fatal(err)
	}
	if err := r.Store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+r.Rows+` (`+columns+`)`); err != nil {
		t.Fatal(err)
	}
	return r
}
