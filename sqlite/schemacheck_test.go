package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/sqlite"
)

// quota is a quota for the schema tests' Admit.
var quota = &idempotency.Quota{Window: time.Minute, MaxKeys: 100}

// TestSchemaMissing: a keys table that does not exist (never migrated, a
// typo in its name, another database file) or lacks a column gives
// ErrSchema naming the table (the column) and Migrate, from Do, Run, Admit
// and CheckSchema: never ErrStore, whose "retrying is safe" would send the
// caller the wrong way. fn's own missing table is fn's error.
func TestSchemaMissing(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "schema.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	store := func(t *testing.T, table string, migrate bool) (*sqlite.Store, *idempotency.Guard[*sql.Tx]) {
		t.Helper()
		s, err := sqlite.New(db, &sqlite.Config{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		if migrate {
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
		}
		g, err := idempotency.New(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s, g
	}

	t.Run("NeverMigrated", func(t *testing.T) {
		table := testkit.Name("keys_")
		_, g := store(t, table, false)
		testkit.SchemaBroken(t, ctx, g, table, true, table)
		_, err := g.AdmitQuota(ctx, idempotency.Key{ID: "k"}, quota)
		testkit.SchemaErr(t, "Admit", err, table+"_quota", "Migrate")
	})

	t.Run("KeysByCollation", func(t *testing.T) {
		// A table of the user's own migrations whose key columns ignore
		// case: "Acme" and "acme" would be one scope.
		for _, col := range []string{"scope", "id"} {
			table := testkit.Name("keys_")
			ddl, err := sqlite.Schema(table)
			if err != nil {
				t.Fatal(err)
			}
			old := "\t" + col + " "
			i := strings.Index(ddl, old)
			j := i + strings.Index(ddl[i:], "COLLATE BINARY")
			if i < 0 || j < i {
				t.Fatalf("no %s column with COLLATE BINARY in %s", col, ddl)
			}
			ddl = ddl[:j] + "COLLATE NOCASE" + ddl[j+len("COLLATE BINARY"):]
			if _, err := db.ExecContext(ctx, ddl); err != nil {
				t.Fatal(err)
			}
			_, g := store(t, table, false)
			err = g.CheckSchema(ctx, idempotency.SchemaCheck{})
			testkit.SchemaErr(t, "CheckSchema", err, table, "compares "+col+" by COLLATE NOCASE, not BINARY")
		}
		_, g := store(t, testkit.Name("keys_"), true)
		if err := g.CheckSchema(ctx, idempotency.SchemaCheck{Quota: true}); err != nil {
			t.Fatalf("CheckSchema of the table Migrate made: %v", err)
		}
	})

	t.Run("ColumnMissing", func(t *testing.T) {
		table := testkit.Name("keys_")
		_, g := store(t, table, true)
		if _, err := db.ExecContext(ctx, `ALTER TABLE "`+table+`" DROP COLUMN fingerprint`); err != nil {
			t.Fatal(err)
		}
		testkit.SchemaBroken(t, ctx, g, table, true, "fingerprint")
	})

	t.Run("V010", func(t *testing.T) {
		// Do works on a table of v0.1.0 (TestMigrateV010); operations and
		// the check need the columns Migrate adds.
		table := testkit.Name("keys_")
		if _, err := db.ExecContext(ctx, strings.ReplaceAll(v010Schema, "idempotency_keys", table)); err != nil {
			t.Fatal(err)
		}
		s, g := store(t, table, false)
		op := &idempotency.Operation[*sql.Tx]{Name: "op", Finish: func(context.Context, *sql.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, nil
		}}
		_, err := g.Run(ctx, idempotency.Key{ID: "k"}, "fp", nil, op)
		testkit.SchemaErr(t, "Run", err, "Migrate")
		err = g.CheckSchema(ctx, idempotency.SchemaCheck{})
		testkit.SchemaErr(t, "CheckSchema", err, table, "progress, owner, lease_ends, tries", "Migrate")
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if err := g.CheckSchema(ctx, idempotency.SchemaCheck{Quota: true}); err != nil {
			t.Fatalf("CheckSchema after Migrate: %v", err)
		}
	})

	t.Run("QuotaTableMissing", func(t *testing.T) {
		table := testkit.Name("keys_")
		_, g := store(t, table, true)
		if err := g.CheckSchema(ctx, idempotency.SchemaCheck{Quota: true}); err != nil {
			t.Fatalf("CheckSchema of a migrated store: %v", err)
		}
		if _, err := db.ExecContext(ctx, `DROP TABLE "`+table+`_quota"`); err != nil {
			t.Fatal(err)
		}
		if err := g.CheckSchema(ctx, idempotency.SchemaCheck{}); err != nil {
			t.Fatalf("CheckSchema without quotas, no quota table: %v", err)
		}
		err := g.CheckSchema(ctx, idempotency.SchemaCheck{Quota: true})
		testkit.SchemaErr(t, "CheckSchema", err, table+"_quota", "QuotaSchema", "Migrate")
		_, err = g.AdmitQuota(ctx, idempotency.Key{ID: "k"}, quota)
		testkit.SchemaErr(t, "Admit", err, table+"_quota", "Migrate")
		// Do does not need the quota table; fn's own missing table is
		// fn's error.
		if _, err := g.Do(ctx, idempotency.Key{ID: "k"}, "fp", func(*sql.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, nil
		}); err != nil {
			t.Fatalf("Do without the quota table: %v", err)
		}
		_, err = g.Do(ctx, idempotency.Key{ID: "k2"}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
			_, err := tx.ExecContext(ctx, "SELECT * FROM no_such_table_here")
			return idempotency.Response{}, err
		})
		if err == nil || !strings.Contains(err.Error(), "no such table: no_such_table_here") ||
			errors.Is(err, idempotency.ErrSchema) || errors.Is(err, idempotency.ErrStore) {
			t.Fatalf("fn's own missing table: got %v, want SQLite's error itself", err)
		}
	})
}
