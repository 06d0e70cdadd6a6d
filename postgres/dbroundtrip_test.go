package postgres_test

import (
	"database/sql"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/pgdbtest"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// TestDBRoundTrips counts the statements a Do sends through the
// database/sql front end with pgx's stdlib driver, where each is its own
// round trip (database/sql has no pipeline): the figures of the package
// documentation and docs/performance.md. The effect is one statement.
func TestDBRoundTrips(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	cfg, err := pgx.ParseConfig(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	var queries atomic.Int64
	cfg.Tracer = &tracer{queries: &queries}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { _ = db.Close() })
	for _, c := range []struct {
		name           string
		lookup         backend.LookupPolicy
		newKey, replay int64
	}{
		{"LookupNever", backend.LookupNever, 6, 5},
		{"LookupAlways", backend.LookupAlways, 7, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := pgdbtest.NewFixture(t, db, postgres.Config{Lookup: c.lookup})
			g, err := idempotency.New(f.Store, nil)
			if err != nil {
				t.Fatal(err)
			}
			key := idempotency.Key{ID: testkit.Name("rt-")}
			do := func() int64 {
				before := queries.Load()
				_, err := g.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
					return idempotency.Response{Status: 201, Body: []byte("made")}, f.Effect(ctx, tx, key.ID)
				})
				if err != nil {
					t.Fatal(err)
				}
				return queries.Load() - before
			}
			if n := do(); n != c.newKey {
				t.Errorf("new key: %d statements, want %d", n, c.newKey)
			}
			if n := do(); n != c.replay {
				t.Errorf("replay: %d statements, want %d", n, c.replay)
			}
			testkit.MustCount(t, ctx, f.Count, key.ID, 1)
		})
	}
}
