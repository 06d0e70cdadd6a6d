package sqlite_test

import (
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/sqlite"
)

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
	ctx := testkit.Context(t, testTimeout)
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
	ctx := testkit.Context(t, testTimeout)
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

// TestStoreRecord checks the stored record field by field: nanosecond
// times, nil versus empty body and header, binary bytes.
func TestStoreRecord(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	now := time.Unix(1_700_000_000, 123_456_789)
	f := openFixture(t, 1).clocked(t, func() time.Time { return now }) // a test clock: nanoseconds
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
		if err := txn.Complete(ctx, idempotency.Response{Status: 202, Header: c.header, Body: c.body}); err != nil {
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
	ctx := testkit.Context(t, testTimeout)
	now := time.Unix(1_700_000_000, 1)
	var clock atomic.Pointer[time.Time]
	at := func(t time.Time) time.Time { clock.Store(&t); return t }
	f := openFixture(t, 1).clocked(t, func() time.Time { return *clock.Load() })
	key := idempotency.Key{ID: "k"}
	txn, _, err := f.store.Reserve(ctx, reservation(key, at(now), 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := txn.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("old")}); err != nil {
		t.Fatal(err)
	}
	r := reservation(key, at(now.Add(time.Hour-1)), 0)
	if _, rec, err := f.store.Reserve(ctx, r); err != nil || rec == nil || string(rec.Body) != "old" {
		t.Fatalf("1ns before expiry: %v, %v; want the record", rec, err)
	}
	r = reservation(key, at(now.Add(time.Hour)), 0)
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

func TestPurgeLimit(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	var clock atomic.Pointer[time.Time]
	at := func(t time.Time) time.Time { clock.Store(&t); return t }
	f := openFixture(t, 0).clocked(t, func() time.Time { return *clock.Load() })
	base := time.Unix(1_700_000_000, 0)
	for i := range 5 {
		// Completed at base - TTL + i ns: expires at base + i ns.
		r := reservation(idempotency.Key{ID: fmt.Sprint("old", i)}, at(base.Add(time.Duration(i)*time.Nanosecond-time.Hour)), 0)
		txn, _, err := f.store.Reserve(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if err := txn.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	at(base.Add(3 * time.Nanosecond)) // old0..old3 expired (<=), old4 not
	for _, want := range []int{2, 2, 0} {
		if n, err := f.store.Purge(ctx, 2); err != nil || n != want {
			t.Fatalf("Purge(limit 2): got %d, %v; want %d", n, err, want)
		}
	}
	if _, rec, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: "old4"}, at(base), 0)); err != nil || rec == nil {
		t.Fatalf("unexpired key after purge: %v, %v; want kept", rec, err)
	}
}
