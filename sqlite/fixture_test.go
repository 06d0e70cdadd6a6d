package sqlite_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/sqlite"
)

func randName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s_%x", prefix, b)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// fixture is one database file with a keys table and an effects table.
type fixture struct {
	db      *sql.DB
	store   *sqlite.Store
	table   string
	effects string
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
	ctx := testCtx(t)
	if maxConns > 0 {
		db.SetMaxOpenConns(maxConns)
	}
	table := randName("keys")
	store, err := sqlite.New(db, &sqlite.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	effects := table + "_effects"
	if _, err := db.ExecContext(ctx, `CREATE TABLE "`+effects+`" (tag TEXT)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Every connection is back in the pool once the case is over (the
		// holder of a case may still be unwinding: give it a moment).
		deadline := time.Now().Add(5 * time.Second)
		for db.Stats().InUse != 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("%d connections still in use after the case: leaked", n)
		}
		_ = db.Close()
	})
	return &fixture{db: db, store: store, table: table, effects: effects}
}

func openFixture(t testing.TB, maxConns int) *fixture {
	t.Helper()
	db, err := sqlite.Open(testCtx(t), filepath.Join(t.TempDir(), "test.db"))
	if err != nil {
		t.Fatal(err)
	}
	return newFixture(t, db, maxConns)
}

func (f *fixture) effect(ctx context.Context, tx *sql.Tx, tag string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO "`+f.effects+`" (tag) VALUES (?)`, tag)
	return err
}

func (f *fixture) count(ctx context.Context, tag string) (int, error) {
	var n int
	err := f.db.QueryRowContext(ctx, `SELECT count(*) FROM "`+f.effects+`" WHERE tag = ?`, tag).Scan(&n)
	return n, err
}

func (f *fixture) conformance() conformance.Fixture[*sql.Tx] {
	return conformance.Fixture[*sql.Tx]{Store: f.store, Effect: f.effect, Count: f.count, Bare: f.bare, Fill: f.fill}
}

// bare is the baseline of the benchmarks: the same one-row insert as
// effect, in a plain transaction of the same *sql.DB (same file, same DSN
// options, so the same journal mode, synchronous mode and immediate BEGIN).
func (f *fixture) bare(ctx context.Context, tag string) error {
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f.effect(ctx, tx, tag); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
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

func reservation(key idempotency.Key, now time.Time, wait time.Duration) idempotency.Reservation {
	return idempotency.Reservation{Key: key, Fingerprint: "fp", Now: now, ExpiresAt: now.Add(time.Hour), Wait: wait}
}

// hold reserves key through the store and keeps it until the returned
// function is called.
func hold(t *testing.T, f *fixture, key idempotency.Key) (release func()) {
	t.Helper()
	ctx := testCtx(t)
	txn, _, err := f.store.Reserve(ctx, reservation(key, time.Now(), 0))
	if err != nil || txn == nil {
		t.Fatalf("hold: %v", err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := txn.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("held")}, time.Now().Add(time.Hour)); err != nil {
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
