package postgres_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// testTimeout bounds the context of every test of this package.
const testTimeout = 30 * time.Second

// isolation sets the session's default isolation level on every connection
// of a pool, as a pool configured by its user could.
func isolation(level string) func(*pgxpool.Config) {
	return func(c *pgxpool.Config) {
		c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "SET default_transaction_isolation = '"+level+"'")
			return err
		}
	}
}

// newPool returns a pool of at most maxConns connections (8 when 0) to the
// test database, with an application_name of its own, closed at cleanup; before that, cleanup fails the test if
// a connection is still acquired.
func newPool(t testing.TB, maxConns int, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	if maxConns <= 0 {
		maxConns = 8
	}
	cfg.MaxConns = int32(maxConns)
	cfg.ConnConfig.RuntimeParams["application_name"] = testkit.Name("idem_test_")
	for _, f := range configure {
		f(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	testkit.CheckReleased(t, "pool connections", func() int { return int(pool.Stat().AcquiredConns()) })
	return pool
}

// fixture is a migrated store on a fresh table plus an effects table.
type fixture struct {
	pool    *pgxpool.Pool
	store   *postgres.Store
	table   string
	effects string
}

func newFixture(t testing.TB, pool *pgxpool.Pool, cfg postgres.Config) *fixture {
	t.Helper()
	ctx := testkit.Context(t, testTimeout)
	if cfg.Table == "" {
		cfg.Table = testkit.Name("idem_")
	}
	f := &fixture{pool: pool, table: cfg.Table, effects: cfg.Table + "_effects"}
	if len(f.effects) > 63 {
		f.effects = testkit.Name("idem_effects_")
	}
	pgkit.DropAtCleanup(t, testenv.PostgresDSN(t), "TABLE", f.table, f.effects)
	if len(f.table) <= 57 && !strings.Contains(f.table, ".") { // Migrate's quota table too
		pgkit.DropAtCleanup(t, testenv.PostgresDSN(t), "TABLE", f.table+"_quota")
	}
	store, err := postgres.New(pool, &cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+f.effects+" (tag TEXT)"); err != nil {
		t.Fatalf("create effects table: %v", err)
	}
	f.store = store
	return f
}

func (f *fixture) effect(ctx context.Context, tx pgx.Tx, tag string) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+f.effects+" (tag) VALUES ($1)", tag)
	return err
}

func (f *fixture) count(ctx context.Context, tag string) (int, error) {
	var n int
	err := f.pool.QueryRow(ctx, "SELECT count(*) FROM "+f.effects+" WHERE tag = $1", tag).Scan(&n)
	return n, err
}

func (f *fixture) guard(t testing.TB, cfg *idempotency.Config) *idempotency.Guard[pgx.Tx] {
	t.Helper()
	g, err := idempotency.New(f.store, cfg)
	if err != nil {
		t.Fatalf("idempotency.New: %v", err)
	}
	return g
}

func harness(cfg postgres.Config, configure ...func(*pgxpool.Config)) conformance.Harness[pgx.Tx] {
	return conformance.Harness[pgx.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[pgx.Tx] {
			c := cfg
			c.Clock = opts.Clock
			f := newFixture(t, newPool(t, opts.MaxConns, configure...), c)
			// Another store on the same table, with a pool of its own:
			// another process of the service.
			reopen := func(context.Context) (idempotency.KeyStore[pgx.Tx], error) {
				c := c
				c.Table = f.table
				s, err := postgres.New(newPool(t, cmp.Or(opts.MaxConns, 4), configure...), &c)
				if err != nil {
					return nil, err
				}
				return s, nil
			}
			return conformance.Fixture[pgx.Tx]{Store: f.store, Effect: f.effect, Count: f.count, Bare: f.bare, Fill: f.fill, Reopen: reopen}
		},
	}
}

// bare is the baseline of the benchmarks: the same one-row insert as
// effect, in a plain transaction of the same pool.
func (f *fixture) bare(ctx context.Context, tag string) error {
	return pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error { return f.effect(ctx, tx, tag) })
}

// fill writes n completed keys in scope "fill" (no benchmark uses it),
// expiring at expiresAt, in one INSERT ... SELECT over generate_series, then
// ANALYZEs the table, as autovacuum would after such a bulk load (the test
// server runs with autovacuum off).
func (f *fixture) fill(ctx context.Context, n int, expiresAt time.Time) error {
	table := pgx.Identifier(strings.Split(f.table, ".")).Sanitize()
	_, err := f.pool.Exec(ctx, `INSERT INTO `+table+` (scope, id, fingerprint, state, status, header, body, created_at, expires_at)
		SELECT 'fill', 'fill-' || g, 'fp', 'completed', 201, '{"Content-Type":["application/json"]}', '{"filled":true}',
			$1::timestamptz - interval '24 hours', $1::timestamptz
		FROM generate_series(1, $2::int) g`, expiresAt, n)
	if err != nil {
		return fmt.Errorf("fill %d keys: %w", n, err)
	}
	if _, err := f.pool.Exec(ctx, `ANALYZE `+table); err != nil {
		return fmt.Errorf("analyze after fill: %w", err)
	}
	return nil
}

// waitBlocked returns the process id of a backend of pool (told apart by
// the application_name newPool gives it) once it waits for a lock another
// backend holds.
func waitBlocked(t testing.TB, ctx context.Context, pool *pgxpool.Pool) int {
	t.Helper()
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	conn, err := pgx.Connect(ctx, testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var pid int
		err := conn.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE application_name = $1 AND cardinality(pg_blocking_pids(pid)) > 0 LIMIT 1`, app).Scan(&pid)
		switch {
		case err == nil:
			return pid
		case !errors.Is(err, pgx.ErrNoRows):
			t.Fatalf("watching for a blocked backend of %q: %v", app, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitSessionGone fails t unless the server session pid ends within d.
func waitSessionGone(t testing.TB, ctx context.Context, pid int, d time.Duration) {
	t.Helper()
	conn, err := pgx.Connect(ctx, testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for deadline := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
			t.Fatalf("watching session %d: %v", pid, err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("server session %d still there %v after its caller gave up", pid, d)
		}
	}
}
