package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/sqlite"
)

// testTimeout bounds every test of this package.
const testTimeout = 60 * time.Second

// fixture is one database file with a keys table and an effects table.
type fixture struct {
	db      *sql.DB
	store   *sqlite.Store
	table   string
	effects string
	fx      testkit.Effects // on the effects table
	// reopen, if set, opens another store on the same file and table (with
	// a *sql.DB of its own): [conformance.Fixture].Reopen.
	reopen func(ctx context.Context) (idempotency.KeyStore[*sql.Tx], error)
	// clock is the test clock of the store and of reopen's, or nil.
	clock func() time.Time
}

// openBare opens path with no DSN options at all: no busy timeout, rollback
// journal, deferred transactions.
func openBare(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func newFixture(t testing.TB, db *sql.DB, maxConns int) *fixture {
	t.Helper()
	ctx := testkit.Context(t, testTimeout)
	if maxConns > 0 {
		db.SetMaxOpenConns(maxConns)
	}
	table := testkit.Name("keys_")
	store, err := sqlite.New(db, &sqlite.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	effects := table + "_effects"
	fx := testkit.Effects{DB: db, Table: `"` + effects + `"`}
	if err := fx.Create(ctx, "TEXT"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	// Every connection is back in the pool once the case is over (the
	// holder of a case may still be unwinding: the kit gives it a moment).
	testkit.CheckReleased(t, "connections", func() int { return db.Stats().InUse })
	return &fixture{db: db, store: store, table: table, effects: effects, fx: fx}
}

func openFixture(t testing.TB, maxConns int) *fixture {
	t.Helper()
	path := filepath.Join(t.TempDir(), "test.db")
	db, err := sqlite.Open(testkit.Context(t, testTimeout), path)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, db, maxConns)
	f.reopen = func(ctx context.Context) (idempotency.KeyStore[*sql.Tx], error) {
		db, err := sqlite.Open(ctx, path)
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { _ = db.Close() })
		if maxConns > 0 {
			db.SetMaxOpenConns(maxConns)
		}
		s, err := sqlite.New(db, &sqlite.Config{Table: f.table, Clock: f.clock})
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	return f
}

// clocked replaces the fixture's store with one on the same table that
// reads clock instead of SQLite's (Config.Clock); nil keeps SQLite's.
func (f *fixture) clocked(t testing.TB, clock func() time.Time) *fixture {
	t.Helper()
	if clock == nil {
		return f
	}
	store, err := sqlite.New(f.db, &sqlite.Config{Table: f.table, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	f.store, f.clock = store, clock // Reopen's stores read it too
	return f
}

func (f *fixture) conformance() conformance.Fixture[*sql.Tx] {
	// Bare, the baseline of the benchmarks, is the same one-row insert as
	// Effect in a plain transaction of the same *sql.DB (same file, same DSN
	// options, so the same journal mode, synchronous mode and immediate BEGIN).
	return conformance.Fixture[*sql.Tx]{Store: f.store, Effect: f.fx.Effect, Count: f.fx.Count, Bare: f.fx.Bare, Fill: f.fill, Reopen: f.reopen}
}

// fill writes n completed keys in scope "fill" (no benchmark uses it), all
// expiring at expiresAt, with one INSERT ... SELECT over a recursive CTE.
func (f *fixture) fill(ctx context.Context, n int, expiresAt time.Time) error {
	now := time.Now().UnixNano()
	_, err := f.db.ExecContext(ctx, `WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < ?1)
INSERT INTO "`+f.table+`" (scope, id, fingerprint, state, status, header, body, created_at, expires_at)
SELECT 'fill', 'fill-' || i, 'fp', 'completed', 200, NULL, x'7b7d', ?2, ?3 FROM seq`, n, now, expiresAt.UnixNano())
	return err
}

func guard(t testing.TB, s *sqlite.Store, cfg *idempotency.Config) *idempotency.Guard[*sql.Tx] {
	t.Helper()
	g, err := idempotency.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func reservation(key idempotency.Key, now time.Time, wait time.Duration) backend.Reservation {
	return backend.Reservation{Key: key, Fingerprint: "fp", TTL: time.Hour, Wait: wait}
}

// hold reserves key through the store and keeps it until the returned
// function is called.
func hold(t *testing.T, f *fixture, key idempotency.Key) (release func()) {
	t.Helper()
	ctx := testkit.Context(t, testTimeout)
	txn, _, err := f.store.Reserve(ctx, reservation(key, time.Now(), 0))
	if err != nil || txn == nil {
		t.Fatalf("hold: %v", err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := txn.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("held")}); err != nil {
				t.Errorf("holder Complete: %v", err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

// mustNotRun is the fn of callers that must get a stored answer.
func mustNotRun(*sql.Tx) (idempotency.Response, error) {
	return idempotency.Response{}, errors.New("fn ran for a key that must be answered from the store")
}
