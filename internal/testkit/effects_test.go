package testkit

import (
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

func TestEffects(t *testing.T) {
	ctx := Context(t, 30*time.Second)
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "effects.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	for _, binary := range []bool{false, true} {
		e := Effects{DB: db, Table: `"` + Name("fx_") + `"`, Binary: binary}
		if err := e.Create(ctx, "TEXT NOT NULL"); err != nil {
			t.Fatal(err)
		}
		if err := e.Create(ctx, "TEXT NOT NULL"); err == nil {
			t.Fatal("Create of an existing table: no error")
		}
		MustCount(t, ctx, e.Count, "a", 0)
		if err := e.Bare(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Effect(ctx, tx, "a"); err != nil {
			t.Fatal(err)
		}
		if err := e.Effect(ctx, tx, "b"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		MustCount(t, ctx, e.Count, "a", 1) // the rolled-back effects do not count
		MustCount(t, ctx, e.Count, "b", 0)
		var typ string
		if err := db.QueryRowContext(ctx, "SELECT typeof(tag) FROM "+e.Table).Scan(&typ); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{false: "text", true: "blob"}[binary]; typ != want {
			t.Fatalf("Binary %v: tags stored as %s, want %s", binary, typ, want)
		}
	}
	broken := Effects{DB: db, Table: "missing"}
	if _, err := broken.Count(ctx, "a"); err == nil {
		t.Fatal("Count on a missing table: no error")
	}
	if err := broken.Bare(ctx, "a"); err == nil {
		t.Fatal("Bare on a missing table: no error")
	}
}
