package postgres_test

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// TestOpen: Open refuses a DSN the driver cannot parse with
// ErrInvalidConfig, reaches the test server, and reports a server that
// does not answer as an error that is not ErrInvalidConfig.
func TestOpen(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	for _, dsn := range []string{"postgres://user@host:notaport/db", "host=h port=x", "postgres://h/db?pool_max_conns=0"} {
		if pool, err := postgres.Open(ctx, dsn); !errors.Is(err, idempotency.ErrInvalidConfig) {
			if pool != nil {
				pool.Close()
			}
			t.Errorf("Open(%q): got %v, want ErrInvalidConfig", dsn, err)
		}
	}
	pool, err := postgres.Open(ctx, testenv.PostgresDSN(t))
	if err != nil {
		t.Fatalf("Open(test DSN): %v", err)
	}
	if _, err := postgres.New(pool, nil); err != nil {
		t.Errorf("New on a pool of Open: %v", err)
	}
	pool.Close()
	if _, err := postgres.Open(ctx, "postgres://u@127.0.0.1:1/db?connect_timeout=1"); err == nil || errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("Open(closed port): got %v, want a connection error", err)
	}
}

func TestConfigRefused(t *testing.T) {
	var queries atomic.Int64
	pool := newPool(t, 1, func(c *pgxpool.Config) { c.ConnConfig.Tracer = &tracer{queries: &queries} })
	bad := []string{
		"1abc", "a-b", "a b", `a"b`, "a;drop table x", ".a", "a.", "a.b.c", "ünïcode",
		strings.Repeat("a", 64), "public." + strings.Repeat("a", 64), strings.Repeat("s", 64) + ".a",
	}
	for _, name := range bad {
		if _, err := postgres.New(pool, &postgres.Config{Table: name}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("New with table %q: got %v, want ErrInvalidConfig", name, err)
		}
		if _, err := postgres.Schema(name); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("Schema(%q): got %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := postgres.New(pool, &postgres.Config{TxOptions: pgx.TxOptions{AccessMode: pgx.ReadOnly}}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New with a read-only TxOptions: got %v, want ErrInvalidConfig", err)
	}
	if _, err := postgres.New(pool, &postgres.Config{Lookup: backend.LookupNever + 1}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New with an unknown Lookup: got %v, want ErrInvalidConfig", err)
	}
	if _, err := postgres.New(nil, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New(nil pool): got %v, want ErrInvalidConfig", err)
	}
	for _, name := range []string{"_a", "A1", "public.keys", strings.Repeat("a", 63), strings.Repeat("s", 63) + "." + strings.Repeat("t", 63)} {
		if _, err := postgres.New(pool, &postgres.Config{Table: name}); err != nil {
			t.Errorf("New with table %q: %v", name, err)
		}
	}
	if n := queries.Load(); n != 0 {
		t.Fatalf("New and Schema sent %d statements, want 0", n)
	}
}

func TestSchemaMigrate(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	pool := newPool(t, 2)

	// The published DDL, run twice on a migrated table: idempotent. (Migrate
	// again, alone and concurrently, is conformance's MigrateTwice.)
	f := newFixture(t, pool, postgres.Config{})
	ddl, err := postgres.Schema(f.table)
	if err != nil || ddl != f.store.Schema() {
		t.Fatalf("Schema(%q) = %v, want the store's Schema()", f.table, err)
	}
	for range 2 {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatalf("running Schema(): %v", err)
		}
	}
	var cols int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_name = $1`, f.table).Scan(&cols); err != nil || cols != 13 {
		t.Fatalf("columns of %s: got %d, %v; want 13", f.table, cols, err)
	}

	// Concurrent migrations of one table do not trip over each other.
	table := testkit.Name("idem_")
	pgkit.DropAtCleanup(t, testenv.PostgresDSN(t), "TABLE", table)
	s, err := postgres.New(pool, &postgres.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = s.Migrate(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent Migrate: %v", err)
	}

	// A schema-qualified table works end to end.
	schema := testkit.Name("idem_s_")
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	pgkit.DropAtCleanup(t, testenv.PostgresDSN(t), "SCHEMA", schema)
	qf := newFixture(t, pool, postgres.Config{Table: schema + ".keys"})
	qg := qf.guard(t, nil)
	for i, wantReplayed := range []bool{false, true} {
		r, err := qg.Do(ctx, idempotency.Key{ID: "k"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 200}, qf.effect(ctx, tx, "q")
		})
		if err != nil || r.Replayed != wantReplayed {
			t.Fatalf("schema-qualified table, call %d: got %+v, %v", i, r, err)
		}
	}
	testkit.MustCount(t, ctx, qf.count, "q", 1)

	// Two 63-byte table names sharing a long prefix get distinct indexes.
	prefix := testkit.Name("idem_long_")
	var idx []string
	for _, c := range []string{"a", "b"} {
		name := prefix + strings.Repeat(c, 63-len(prefix))
		lf := newFixture(t, pool, postgres.Config{Table: name})
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%(expires_at)'`, lf.table).Scan(&n); err != nil || n != 1 {
			t.Fatalf("expires_at index of %s: got %d, %v; want 1", name, n, err)
		}
		var def string
		if err := pool.QueryRow(ctx, `SELECT indexname FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%(expires_at)'`, lf.table).Scan(&def); err != nil {
			t.Fatal(err)
		}
		idx = append(idx, def)
	}
	if idx[0] == idx[1] {
		t.Fatalf("two long tables share the index name %q", idx[0])
	}
}
