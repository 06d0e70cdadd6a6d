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
