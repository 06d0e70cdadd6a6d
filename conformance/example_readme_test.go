package conformance_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/sqlite"
)

// The README's "Writing your own backend", with the SQLite store standing
// for the reader's own store: the whole suite runs on it.

// readme:begin readme-conformance
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Harness[*sql.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*sql.Tx] {
			// a fresh store on its own table, capped at opts.MaxConns connections and
			// reading the test clock opts.Clock if set, plus Effect (insert one row
			// tagged tag through tx) and Count (count them)
			return newFixture(t, opts)
		},
		Features: conformance.Features{SerialWriters: true}, // true for SQLite: one writer at a time
	})
}

// readme:end readme-conformance

// newFixture opens a SQLite database of its own for one case, with a keys
// table and an effects table.
func newFixture(t testing.TB, opts conformance.Options) conformance.Fixture[*sql.Tx] {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "keys.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if opts.MaxConns > 0 {
		db.SetMaxOpenConns(opts.MaxConns)
	}
	table := "keys_" + strings.ToLower(rand.Text()[:8])
	store, err := sqlite.New(db, &sqlite.Config{Table: table, Clock: opts.Clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (tag TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return conformance.Fixture[*sql.Tx]{
		Store: store,
		Effect: func(ctx context.Context, tx *sql.Tx, tag string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO effects (tag) VALUES (?)`, tag)
			return err
		},
		Count: func(ctx context.Context, tag string) (int, error) {
			var n int
			err := db.QueryRowContext(ctx, `SELECT count(*) FROM effects WHERE tag = ?`, tag).Scan(&n)
			return n, err
		},
	}
}
