package sqlite_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
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

func TestConformance(t *testing.T) { conformance.Run(t, harness()) }

func harness() conformance.Harness[*sql.Tx] {
	return conformance.Harness[*sql.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*sql.Tx] {
			return openFixture(t, opts.MaxConns).conformance()
		},
		Features: conformance.Features{SerialWriters: true},
	}
}

// BenchmarkStore compares Do with the bare effect transaction on a
// database opened with [sqlite.Open]; see conformance.Benchmark and
// cmd/idembench.
func BenchmarkStore(b *testing.B) { conformance.Benchmark(b, harness()) }

// BenchmarkScale runs Do against 1M existing keys and Purge of 1M expired
// keys under load; see conformance.BenchmarkScale.
func BenchmarkScale(b *testing.B) { conformance.BenchmarkScale(b, harness()) }

// TestConformanceBareDSN runs the suite on databases opened without any DSN
// option (rollback journal, no busy timeout, deferred transactions), as a
// user may open them.
func TestConformanceBareDSN(t *testing.T) {
	conformance.Run(t, conformance.Harness[*sql.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*sql.Tx] {
			return newFixture(t, openBare(t, filepath.Join(t.TempDir(), "bare.db")), opts.MaxConns).conformance()
		},
		Features: conformance.Features{SerialWriters: true},
	})
}

// TestConcurrentSameKeyBareDSN is the hard case of SQLite: on a database
// opened without any DSN option (no busy timeout, rollback journal, deferred
// transactions) 20 concurrent callers of one key fail with SQLITE_BUSY
// unless the store makes them wait. Every caller must succeed: one executes,
// 19 replay, one effect commits.
func TestConcurrentSameKeyBareDSN(t *testing.T) {
	for _, c := range []struct{ name, opts string }{
		{"NoOptions", ""},
		{"WALDeferred", "?_pragma=journal_mode(WAL)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			f := newFixture(t, openBare(t, filepath.Join(t.TempDir(), "bare.db")+c.opts), 0)
			g, err := idempotency.New(f.store, nil)
			if err != nil {
				t.Fatal(err)
			}
			key := idempotency.Key{ID: randName("k")}
			const n = 20
			type result struct {
				resp idempotency.Response
				err  error
			}
			rs := make([]result, n)
			gate := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-gate
					rs[i].resp, rs[i].err = g.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
						if err := f.effect(ctx, tx, "payment"); err != nil {
							return idempotency.Response{}, err
						}
						time.Sleep(20 * time.Millisecond) // let the others pile up
						return idempotency.Response{Status: 201, Body: []byte(fmt.Sprint("caller ", i))}, nil
					})
				})
			}
			close(gate)
			wg.Wait()
			executed := 0
			for i, r := range rs {
				if r.err != nil {
					t.Fatalf("caller %d: %v; want every caller to succeed", i, r.err)
				}
				if !r.resp.Replayed {
					executed++
				}
				if !bytes.Equal(r.resp.Body, rs[0].resp.Body) {
					t.Fatalf("caller %d got %q, caller 0 got %q: want one response", i, r.resp.Body, rs[0].resp.Body)
				}
			}
			if executed != 1 {
				t.Fatalf("executed: got %d, want 1", executed)
			}
			if got, err := f.count(ctx, "payment"); err != nil || got != 1 {
				t.Fatalf("effects: got %d, %v; want 1", got, err)
			}
			// The store restored the DSN's busy timeout (0) on the pool's
			// connections.
			var bt int
			if err := f.db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&bt); err != nil || bt != 0 {
				t.Fatalf("busy_timeout after the calls: got %d, %v; want the DSN's 0", bt, err)
			}
		})
	}
}

func TestInvalidTableRefusedBeforeSQL(t *testing.T) {
	// A database that cannot be opened: any SQL would fail with another
	// error, and New must not even connect.
	db := openBare(t, filepath.Join(t.TempDir(), "no", "such", "dir", "x.db"))
	defer db.Close()
	bad := []string{
		"1keys", "keys-1", `ke"ys`, "keys;DROP TABLE x", "main.keys", "kéys", "keys ", " keys",
		strings.Repeat("k", 64), "sqlite_keys", "SQLITE_keys",
	}
	for _, name := range bad {
		if _, err := sqlite.New(db, &sqlite.Config{Table: name}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("New with table %q: got %v, want ErrInvalidConfig", name, err)
		}
		if _, err := sqlite.Schema(name); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("Schema(%q): got %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := sqlite.Schema(""); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("Schema(\"\"): got %v, want ErrInvalidConfig", err)
	}
	if _, err := sqlite.New(nil, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New(nil): got %v, want ErrInvalidConfig", err)
	}
	for _, name := range []string{"k", "_k", "Keys_2", strings.Repeat("k", 63)} {
		if _, err := sqlite.New(db, &sqlite.Config{Table: name}); err != nil {
			t.Errorf("New with table %q: %v", name, err)
		}
	}
	if n := db.Stats().OpenConnections; n != 0 {
		t.Fatalf("New opened %d connections, want 0 (no SQL in the constructor)", n)
	}
}

func TestOpen(t *testing.T) {
	ctx := testCtx(t)
	for _, p := range []string{"", ":memory:", "file:x.db", "x.db?mode=ro"} {
		if db, err := sqlite.Open(ctx, p); !errors.Is(err, idempotency.ErrInvalidConfig) {
			if db != nil {
				db.Close()
			}
			t.Errorf("Open(%q): got %v, want ErrInvalidConfig", p, err)
		}
	}
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "open.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var mode string
	var fk, bt int
	if err := db.QueryRowContext(ctx, "SELECT (SELECT journal_mode FROM pragma_journal_mode), (SELECT foreign_keys FROM pragma_foreign_keys), (SELECT timeout FROM pragma_busy_timeout)").Scan(&mode, &fk, &bt); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" || fk != 1 || bt != 5000 {
		t.Fatalf("Open: journal_mode %q, foreign_keys %d, busy_timeout %d; want wal, 1, 5000", mode, fk, bt)
	}
}

func TestSchemaAndMigrateIdempotent(t *testing.T) {
	ctx := testCtx(t)
	f := openFixture(t, 0)
	for range 2 {
		if err := f.store.Migrate(ctx); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
		if _, err := f.db.ExecContext(ctx, f.store.Schema()); err != nil {
			t.Fatalf("Schema() run again: %v", err)
		}
	}
	var ddl string
	if err := f.db.QueryRowContext(ctx, "SELECT group_concat(sql, ';') FROM sqlite_schema WHERE tbl_name = (SELECT substr(?, 1, length(?) - 8))", f.effects, f.effects).Scan(&ddl); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ToUpper(ddl), "NOCASE") || !strings.Contains(ddl, "PRIMARY KEY (scope, id)") || !strings.Contains(ddl, "(expires_at)") {
		t.Fatalf("stored DDL: %s; want a binary primary key (scope, id) and an index on expires_at", ddl)
	}
	def, err := sqlite.Schema(sqlite.DefaultTable)
	if err != nil || !strings.Contains(def, `"idempotency_keys"`) || !strings.Contains(def, `"idempotency_keys_expires_at"`) {
		t.Fatalf("Schema(DefaultTable): %v\n%s", err, def)
	}
}

func guard(t testing.TB, s *sqlite.Store, cfg *idempotency.Config) *idempotency.Guard[*sql.Tx] {
	t.Helper()
	g, err := idempotency.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestKeysCaseSensitive(t *testing.T) {
	ctx := testCtx(t)
	f := openFixture(t, 0)
	g := guard(t, f.store, nil)
	for _, k := range []idempotency.Key{{ID: "abc"}, {ID: "ABC"}, {Scope: "Acme", ID: "abc"}, {Scope: "acme", ID: "abc"}} {
		tag := k.Scope + "/" + k.ID
		for i := range 2 {
			r, err := g.Do(ctx, k, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 200, Body: []byte(tag)}, f.effect(ctx, tx, tag)
			})
			if err != nil || r.Replayed != (i == 1) || string(r.Body) != tag {
				t.Fatalf("key %+v call %d: got %+v, %v", k, i, r, err)
			}
		}
		if n, err := f.count(ctx, tag); err != nil || n != 1 {
			t.Fatalf("key %+v: %d effects, %v; want 1", k, n, err)
		}
	}
}

func reservation(key idempotency.Key, now time.Time, wait time.Duration) idempotency.Reservation {
	return idempotency.Reservation{Key: key, Fingerprint: "fp", Now: now, ExpiresAt: now.Add(time.Hour), Wait: wait}
}

// TestStoreRecord checks the stored record field by field: nanosecond
// times, nil versus empty body and header, binary bytes.
func TestStoreRecord(t *testing.T) {
	ctx := testCtx(t)
	f := openFixture(t, 1)
	now := time.Unix(1_700_000_000, 123_456_789)
	cases := []struct {
		name   string
		header http.Header
		body   []byte
	}{
		{"nil", nil, nil},
		{"empty", nil, []byte{}}, // an empty header is stored as none
		{"binary", http.Header{"X-A": {"1", "2"}}, []byte{0, 0xff, 0, 'a', 0}},
	}
	for _, c := range cases {
		key := idempotency.Key{Scope: "s", ID: c.name}
		txn, rec, err := f.store.Reserve(ctx, reservation(key, now, 0))
		if err != nil || txn == nil || rec != nil {
			t.Fatalf("%s: Reserve: %v, %v, %v; want a txn", c.name, txn, rec, err)
		}
		if err := txn.Complete(ctx, idempotency.Response{Status: 202, Header: c.header, Body: c.body}, now.Add(time.Hour)); err != nil {
			t.Fatalf("%s: Complete: %v", c.name, err)
		}
		if err := txn.Rollback(ctx); err == nil {
			t.Fatalf("%s: Rollback after Complete: got nil, want an error", c.name)
		}
		txn, rec, err = f.store.Reserve(ctx, reservation(key, now.Add(time.Minute), 0))
		if err != nil || txn != nil || rec == nil {
			t.Fatalf("%s: second Reserve: %v, %v, %v; want the record", c.name, txn, rec, err)
		}
		want := &idempotency.Record{Key: key, Fingerprint: "fp", Status: 202, Header: c.header, Body: c.body,
			CreatedAt: now.UTC(), ExpiresAt: now.Add(time.Hour).UTC()}
		if !reflect.DeepEqual(rec, want) {
			t.Fatalf("%s: record\n got %#v\nwant %#v", c.name, rec, want)
		}
	}
}

// TestExpiredTakeover: a live key is returned; at ExpiresAt it is taken
// over in the same statement, with the new fingerprint.
func TestExpiredTakeover(t *testing.T) {
	ctx := testCtx(t)
	f := openFixture(t, 1)
	now := time.Unix(1_700_000_000, 1)
	key := idempotency.Key{ID: "k"}
	txn, _, err := f.store.Reserve(ctx, reservation(key, now, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := txn.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("old")}, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	r := reservation(key, now.Add(time.Hour-1), 0)
	if _, rec, err := f.store.Reserve(ctx, r); err != nil || rec == nil || string(rec.Body) != "old" {
		t.Fatalf("1ns before expiry: %v, %v; want the record", rec, err)
	}
	r = reservation(key, now.Add(time.Hour), 0)
	r.Fingerprint = "fp2"
	txn, rec, err := f.store.Reserve(ctx, r)
	if err != nil || txn == nil || rec != nil {
		t.Fatalf("at expiry: %v, %v, %v; want a txn", txn, rec, err)
	}
	// Rolled back: the old row comes back (expired, so still taken over).
	if err := txn.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var fp, state string
	if err := f.db.QueryRowContext(ctx, `SELECT fingerprint, state FROM "`+strings.TrimSuffix(f.effects, "_effects")+`" WHERE id = 'k'`).Scan(&fp, &state); err != nil || fp != "fp" || state != "completed" {
		t.Fatalf("after the rollback of a takeover: %q %q %v; want the old completed row", fp, state, err)
	}
}

// TestWaitBoundDoesNotLeak: the reservation's busy timeout (the wait bound)
// is not what the caller's statements run with, nor what the pool's
// connection keeps afterwards.
func TestWaitBoundDoesNotLeak(t *testing.T) {
	ctx := testCtx(t)
	f := openFixture(t, 1)
	g := guard(t, f.store, &idempotency.Config{NoWait: true})
	var inFn int
	_, err := g.Do(ctx, idempotency.Key{ID: "k"}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 200}, tx.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&inFn)
	})
	if err != nil {
		t.Fatal(err)
	}
	var after int
	if err := f.db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&after); err != nil {
		t.Fatal(err)
	}
	if inFn != 5000 || after != 5000 {
		t.Fatalf("busy_timeout inside fn %d, after Do %d; want the DSN's 5000 both", inFn, after)
	}
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

// TestCancelWhileWaitingLongBound: a caller waiting under a 30s bound
// returns with ctx's error as soon as ctx is cancelled, and its connection
// goes back to the pool.
func TestCancelWhileWaitingLongBound(t *testing.T) {
	f := openFixture(t, 2)
	key := idempotency.Key{ID: "k"}
	release := hold(t, f, key)
	ctx, cancel := context.WithCancel(testCtx(t))
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	txn, rec, err := f.store.Reserve(ctx, reservation(key, time.Now(), 30*time.Second))
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Reserve returned %v after its ctx was cancelled", took-200*time.Millisecond)
	}
	if !errors.Is(err, context.Canceled) || txn != nil || rec != nil {
		t.Fatalf("cancelled waiter: got %v, %v, %v; want context.Canceled", txn, rec, err)
	}
	if n := f.db.Stats().InUse; n != 1 {
		t.Fatalf("connections in use: got %d, want 1 (the holder's)", n)
	}
	release()
	// The waiter's connection kept its busy timeout.
	for range 2 {
		var bt int
		if err := f.db.QueryRowContext(testCtx(t), "PRAGMA busy_timeout").Scan(&bt); err != nil || bt != 5000 {
			t.Fatalf("busy_timeout: %d, %v; want 5000", bt, err)
		}
	}
}

// TestOtherKeyWaitsForWriter documents SerialWriters: while one key is held,
// a caller of another key waits for the write lock, gets ErrConflict (a busy
// database, never "key in progress") past its bound, and gets through once
// the holder commits.
func TestOtherKeyWaitsForWriter(t *testing.T) {
	ctx := testCtx(t)
	f := openFixture(t, 0)
	release := hold(t, f, idempotency.Key{ID: "held"})
	other := idempotency.Key{ID: "other"}
	for _, wait := range []time.Duration{0, 100 * time.Millisecond} {
		_, _, err := f.store.Reserve(ctx, reservation(other, time.Now(), wait))
		if !errors.Is(err, idempotency.ErrConflict) || errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("other key, wait %v, while one is held: got %v, want ErrConflict only", wait, err)
		}
	}
	time.AfterFunc(100*time.Millisecond, release)
	txn, _, err := f.store.Reserve(ctx, reservation(other, time.Now(), 10*time.Second))
	if err != nil || txn == nil {
		t.Fatalf("other key after the holder commits: %v", err)
	}
	if err := txn.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestRollbackWithCancelledContext(t *testing.T) {
	f := openFixture(t, 1)
	ctx, cancel := context.WithCancel(testCtx(t))
	key := idempotency.Key{ID: "k"}
	txn, _, err := f.store.Reserve(ctx, reservation(key, time.Now(), 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.effect(ctx, txn.Tx(), "x"); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := txn.Rollback(ctx); err != nil {
		t.Fatalf("Rollback with a cancelled ctx: %v", err)
	}
	ctx = testCtx(t)
	if n, err := f.count(ctx, "x"); err != nil || n != 0 {
		t.Fatalf("effects after rollback: %d, %v; want 0", n, err)
	}
	txn, _, err = f.store.Reserve(ctx, reservation(key, time.Now(), 0))
	if err != nil || txn == nil {
		t.Fatalf("key after rollback: %v; want it free", err)
	}
	// Complete with a cancelled ctx fails and commits nothing.
	if err := f.effect(ctx, txn.Tx(), "y"); err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if err := txn.Complete(cctx, idempotency.Response{Status: 200}, time.Now().Add(time.Hour)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Complete with a cancelled ctx: got %v, want context.Canceled", err)
	}
	if n, err := f.count(ctx, "y"); err != nil || n != 0 {
		t.Fatalf("effects after a cancelled Complete: %d, %v; want 0", n, err)
	}
}

func TestPurgeLimit(t *testing.T) {
	ctx := testCtx(t)
	f := openFixture(t, 0)
	base := time.Unix(1_700_000_000, 0)
	for i := range 5 {
		r := reservation(idempotency.Key{ID: fmt.Sprint("old", i)}, base, 0)
		r.ExpiresAt = base.Add(time.Duration(i) * time.Nanosecond)
		txn, _, err := f.store.Reserve(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if err := txn.Complete(ctx, idempotency.Response{Status: 200}, r.ExpiresAt); err != nil {
			t.Fatal(err)
		}
	}
	before := base.Add(3 * time.Nanosecond) // old0..old3 expired (<=), old4 not
	for _, want := range []int{2, 2, 0} {
		if n, err := f.store.Purge(ctx, before, 2); err != nil || n != want {
			t.Fatalf("Purge(limit 2): got %d, %v; want %d", n, err, want)
		}
	}
	if _, rec, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: "old4"}, base, 0)); err != nil || rec == nil {
		t.Fatalf("unexpired key after purge: %v, %v; want kept", rec, err)
	}
}
