package sqlite_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/sqlite"
)

func TestConfigRefused(t *testing.T) {
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

func TestSchemaMigrate(t *testing.T) {
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
