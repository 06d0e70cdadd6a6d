package mysql

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// quota is a quota for the schema tests' Admit.
var quota = &idempotency.Quota{Window: time.Minute, MaxKeys: 100}

// TestSchemaMissing: a keys table that does not exist (never migrated, a
// typo in its name) or lacks a column gives ErrSchema naming the table
// (the column) and Migrate, from Do, Run, Admit and CheckSchema: never
// ErrStore, whose "retrying is safe" would send the caller the wrong way.
// fn's own missing table is fn's error, not the store's schema.
func TestSchemaMissing(t *testing.T) {
	ctx := testkit.Context(t, 60*time.Second)
	db := openDB(t, testConfig(t, nil), 4)
	guard := func(s *Store) *idempotency.Guard[*sql.Tx] {
		g, err := idempotency.New(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}

	t.Run("NeverMigrated", func(t *testing.T) {
		table := testkit.Name("idem_test_")
		s, err := New(db, &Config{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		g := guard(s)
		testkit.SchemaBroken(t, ctx, g, table, true, table)
		_, err = g.AdmitQuota(ctx, idempotency.Key{ID: "k"}, quota)
		testkit.SchemaErr(t, "Admit", err, table+"_quota", "Migrate")
	})

	t.Run("NoDatabase", func(t *testing.T) {
		// Open refuses such a DSN; a pool of the caller's own may have none.
		cfg := testConfig(t, nil)
		cfg.DBName = ""
		nodb := openDB(t, cfg, 2)
		s, err := New(nodb, nil)
		if err != nil {
			t.Fatal(err)
		}
		testkit.SchemaBroken(t, ctx, guard(s), DefaultTable, false, "No database selected")
	})

	t.Run("ColumnMissing", func(t *testing.T) {
		f := newFixture(t, db, nil)
		if _, err := db.ExecContext(ctx, "ALTER TABLE `"+f.table+"` DROP COLUMN fingerprint"); err != nil {
			t.Fatal(err)
		}
		testkit.SchemaBroken(t, ctx, guard(f.store), f.table, true, "fingerprint")
	})

	t.Run("KeysByCollation", func(t *testing.T) {
		// A table of the user's own migrations with VARCHAR keys: the
		// default collation takes "Acme" and "acme" for one scope.
		for _, col := range []string{"scope", "id"} {
			f := newFixture(t, db, nil)
			if _, err := db.ExecContext(ctx, "ALTER TABLE `"+f.table+"` MODIFY "+col+" VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL"); err != nil {
				t.Fatal(err)
			}
			err := guard(f.store).CheckSchema(ctx, idempotency.SchemaCheck{})
			testkit.SchemaErr(t, "CheckSchema", err, f.table, "column "+col+" is VARCHAR, not VARBINARY", "MODIFY "+col+" VARBINARY(255)")
		}
		f := newFixture(t, db, nil)
		if err := guard(f.store).CheckSchema(ctx, idempotency.SchemaCheck{Quota: true}); err != nil {
			t.Fatalf("CheckSchema of the table Migrate made: %v", err)
		}
	})

	t.Run("V010", func(t *testing.T) {
		// Do works on a table of v0.1.0 (TestMigrateFromV010); operations
		// and the check need the columns Migrate adds.
		f := newFixture(t, db, nil)
		if _, err := db.ExecContext(ctx, "ALTER TABLE `"+f.table+"` DROP COLUMN progress, DROP COLUMN owner, DROP COLUMN lease_ends, DROP COLUMN tries"); err != nil {
			t.Fatal(err)
		}
		g := guard(f.store)
		op := &idempotency.Operation[*sql.Tx]{Name: "op", Finish: func(context.Context, *sql.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, nil
		}}
		_, err := g.Run(ctx, idempotency.Key{ID: "k"}, "fp", nil, op)
		testkit.SchemaErr(t, "Run", err, "Migrate")
		err = g.CheckSchema(ctx, idempotency.SchemaCheck{})
		testkit.SchemaErr(t, "CheckSchema", err, f.table, "progress, owner, lease_ends, tries", "Migrate")
		if err := f.store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if err := g.CheckSchema(ctx, idempotency.SchemaCheck{Quota: true}); err != nil {
			t.Fatalf("CheckSchema after Migrate: %v", err)
		}
	})

	t.Run("QuotaTableMissing", func(t *testing.T) {
		f := newFixture(t, db, nil)
		g := guard(f.store)
		if err := g.CheckSchema(ctx, idempotency.SchemaCheck{Quota: true}); err != nil {
			t.Fatalf("CheckSchema of a migrated store: %v", err)
		}
		if _, err := db.ExecContext(ctx, "DROP TABLE `"+quotaName(f.table)+"`"); err != nil {
			t.Fatal(err)
		}
		if err := g.CheckSchema(ctx, idempotency.SchemaCheck{}); err != nil {
			t.Fatalf("CheckSchema without quotas, no quota table: %v", err)
		}
		err := g.CheckSchema(ctx, idempotency.SchemaCheck{Quota: true})
		testkit.SchemaErr(t, "CheckSchema", err, quotaName(f.table), "QuotaSchema", "Migrate")
		_, err = g.AdmitQuota(ctx, idempotency.Key{ID: "k"}, quota)
		testkit.SchemaErr(t, "Admit", err, quotaName(f.table), "Migrate")
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
		var me *gomysql.MySQLError
		if !errors.As(err, &me) || me.Number != 1146 || errors.Is(err, idempotency.ErrSchema) || errors.Is(err, idempotency.ErrStore) {
			t.Fatalf("fn's own missing table: got %v, want the 1146 error itself", err)
		}
	})
}
