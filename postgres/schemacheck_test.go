package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// quota is a quota for the schema tests' Admit.
var quota = &idempotency.Quota{Window: time.Minute, MaxKeys: 100}

// TestSchemaMissing: a keys table that does not exist (never migrated, a
// typo in its name or schema) or lacks a column gives ErrSchema naming the
// table and Migrate, from Do, Run, Admit and CheckSchema: never ErrStore,
// whose "retrying is safe" would send the caller the wrong way.
func TestSchemaMissing(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	pool := newPool(t, 4)
	dsn := testenv.PostgresDSN(t)

	t.Run("NeverMigrated", func(t *testing.T) {
		table := testkit.Name("idem_")
		pgkit.DropAtCleanup(t, dsn, "TABLE", table, table+"_quota")
		s, err := postgres.New(pool, &postgres.Config{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		g, err := idempotency.New(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		testkit.SchemaBroken(t, ctx, g, table, true, table)
		_, err = g.AdmitQuota(ctx, idempotency.Key{ID: "k"}, quota)
		testkit.SchemaErr(t, "Admit", err, table+"_quota", "Migrate")
	})

	t.Run("SchemaTypo", func(t *testing.T) {
		table := "no_such_schema_here." + testkit.Name("idem_")
		s, err := postgres.New(pool, &postgres.Config{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		g, err := idempotency.New(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		testkit.SchemaBroken(t, ctx, g, table, true, table)
	})

	t.Run("ColumnMissing", func(t *testing.T) {
		f := newFixture(t, pool, postgres.Config{})
		if _, err := pool.Exec(ctx, `ALTER TABLE "`+f.table+`" DROP COLUMN fingerprint`); err != nil {
			t.Fatal(err)
		}
		testkit.SchemaBroken(t, ctx, f.guard(t, nil), f.table, true, f.table, "fingerprint")
	})

	t.Run("KeysByCollation", func(t *testing.T) {
		// Tables of the user's own migrations whose keys do not compare
		// byte for byte: "Acme" and "acme" (or "a" and "a ") one key.
		coll := testkit.Name("idem_ci_")
		if _, err := pool.Exec(ctx, `CREATE COLLATION "`+coll+`" (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP COLLATION IF EXISTS "`+coll+`"`) })
		for _, c := range []struct{ alter, want string }{
			{`ALTER COLUMN scope TYPE character(255)`, "column scope is character, not text"},
			{`ALTER COLUMN id TYPE text COLLATE "` + coll + `"`, "column id has a nondeterministic collation"},
		} {
			f := newFixture(t, pool, postgres.Config{})
			if _, err := pool.Exec(ctx, `ALTER TABLE "`+f.table+`" `+c.alter); err != nil {
				t.Fatal(err)
			}
			err := f.guard(t, nil).CheckSchema(ctx, idempotency.SchemaCheck{})
			testkit.SchemaErr(t, "CheckSchema", err, f.table, c.want, `text COLLATE "C"`)
		}
		f := newFixture(t, pool, postgres.Config{})
		if _, err := pool.Exec(ctx, `ALTER TABLE "`+f.table+`" ALTER COLUMN id TYPE character varying(255) COLLATE "C"`); err != nil {
			t.Fatal(err)
		}
		if err := f.guard(t, nil).CheckSchema(ctx, idempotency.SchemaCheck{Quota: true}); err != nil {
			t.Fatalf("CheckSchema of a table with varchar keys: %v", err)
		}
	})

	t.Run("V010", func(t *testing.T) {
		// Do works on a table of v0.1.0 (TestMigrateFromV010); operations
		// and the check need the columns Migrate adds.
		f := newFixture(t, pool, postgres.Config{})
		if _, err := pool.Exec(ctx, `ALTER TABLE "`+f.table+`" DROP COLUMN progress, DROP COLUMN owner, DROP COLUMN lease_ends, DROP COLUMN tries`); err != nil {
			t.Fatal(err)
		}
		g := f.guard(t, nil)
		op := &idempotency.Operation[pgx.Tx]{Name: "op", Finish: func(context.Context, pgx.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, nil
		}}
		_, err := g.Run(ctx, idempotency.Key{ID: "k"}, "fp", nil, op)
		testkit.SchemaErr(t, "Run", err, f.table, "Migrate")
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
		f := newFixture(t, pool, postgres.Config{})
		g := f.guard(t, nil)
		if err := g.CheckSchema(ctx, idempotency.SchemaCheck{Quota: true}); err != nil {
			t.Fatalf("CheckSchema of a migrated store: %v", err)
		}
		if _, err := pool.Exec(ctx, `DROP TABLE "`+f.table+`_quota"`); err != nil {
			t.Fatal(err)
		}
		if err := g.CheckSchema(ctx, idempotency.SchemaCheck{}); err != nil {
			t.Fatalf("CheckSchema without quotas, no quota table: %v", err)
		}
		err := g.CheckSchema(ctx, idempotency.SchemaCheck{Quota: true})
		testkit.SchemaErr(t, "CheckSchema", err, f.table+"_quota", "QuotaSchema", "Migrate")
		_, err = g.AdmitQuota(ctx, idempotency.Key{ID: "k"}, quota)
		testkit.SchemaErr(t, "Admit", err, f.table+"_quota", "Migrate")
		// Do does not need the quota table; fn's own missing table is
		// fn's error.
		if _, err := g.Do(ctx, idempotency.Key{ID: "k"}, "fp", func(pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, nil
		}); err != nil {
			t.Fatalf("Do without the quota table: %v", err)
		}
		_, err = g.Do(ctx, idempotency.Key{ID: "k2"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			_, err := tx.Exec(ctx, "SELECT * FROM no_such_table_here")
			return idempotency.Response{}, err
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P01" || errors.Is(err, idempotency.ErrSchema) || errors.Is(err, idempotency.ErrStore) {
			t.Fatalf("fn's own missing table: got %v, want the 42P01 error itself", err)
		}
	})
}
