package conformance_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/sqlite"
)

// testStore is what a backend's test file holds, as TestConformance(t):
// a fixture per case (a fresh database, the store on it, an effects
// table), and the backend's honest features.
func testStore(t *testing.T) {
	conformance.Run(t, conformance.Harness[*sql.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*sql.Tx] {
			ctx := context.Background()
			db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "keys.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			if opts.MaxConns > 0 {
				db.SetMaxOpenConns(opts.MaxConns)
			}
			store, err := sqlite.New(db, &sqlite.Config{Clock: opts.Clock})
			if err != nil {
				t.Fatal(err)
			}
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
				Count: func(ctx context.Context, tag string) (n int, err error) {
					err = db.QueryRowContext(ctx, `SELECT count(*) FROM effects WHERE tag = ?`, tag).Scan(&n)
					return n, err
				},
			}
		},
		Features: conformance.Features{SerialWriters: true},
	})
}

// Example shows a backend's conformance test: one function that builds a
// fresh fixture for each case of [conformance.Run]. A store of your own
// runs the same suite from its TestConformance.
func Example() {
	_ = testStore // func TestConformance(t *testing.T) { testStore(t) }
}
