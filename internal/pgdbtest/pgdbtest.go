// Package pgdbtest runs the shared store suites on the database/sql front end
// of the postgres store ([postgres.DBStore]) for any database/sql driver:
// the postgres package's tests use it with pgx's stdlib driver, the nested
// module internal/pqtest with lib/pq (kept out of the core module).
package pgdbtest

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// Open opens driver's *sql.DB on dsn with at most maxConns connections (8
// when 0), closed at cleanup; before that, cleanup fails the test if a
// connection is still in use.
func Open(t testing.TB, driver, dsn string, maxConns int) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatalf("sql.Open(%q): %v", driver, err)
	}
	db.SetMaxOpenConns(cmp.Or(maxConns, 8))
	db.SetMaxIdleConns(cmp.Or(maxConns, 8))
	t.Cleanup(func() { _ = db.Close() })
	testkit.CheckReleased(t, "database/sql connections", func() int { return db.Stats().InUse })
	return db
}

// Fixture is a migrated DBStore on a fresh table, plus an effects table,
// both dropped at cleanup.
type Fixture struct {
	DB      *sql.DB
	Store   *postgres.DBStore
	Table   string
	Effects string
}

// NewFixture migrates a DBStore with cfg on db (a fresh table unless
// cfg.Table is set) and creates its effects table, both dropped at cleanup.
func NewFixture(t testing.TB, db *sql.DB, cfg postgres.Config) *Fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if cfg.Table == "" {
		cfg.Table = testkit.Name("idem_")
	}
	f := &Fixture{DB: db, Table: cfg.Table, Effects: cfg.Table + "_effects"}
	dropAtCleanup(t, db, true, f.Table, f.Effects, f.Table+"_quota")
	store, err := postgres.NewDB(db, &cfg)
	if err != nil {
		t.Fatalf("NewDB: %v", err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+f.Effects+" (tag TEXT)"); err != nil {
		t.Fatalf("create effects table: %v", err)
	}
	f.Store = store
	return f
}

// dropAtCleanup drops the tables at t's cleanup, through db (before db
// closes): the DSN may name settings only db's driver knows, and a
// PgBouncer in between may have cut other connections. A failure fails t
// if strict, else (after the fault suite's cuts) it is logged.
func dropAtCleanup(t testing.TB, db *sql.DB, strict bool, tables ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS `+strings.Join(tables, ", ")); err != nil {
			if strict {
				t.Errorf("drop %v: %v", tables, err)
			} else {
				t.Logf("drop %v: %v", tables, err)
			}
		}
	})
}

// Effect inserts one effect row tagged tag in fn's transaction.
func (f *Fixture) Effect(ctx context.Context, tx *sql.Tx, tag string) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO "+f.Effects+" (tag) VALUES ($1)", tag)
	return err
}

// Count counts the effect rows tagged tag.
func (f *Fixture) Count(ctx context.Context, tag string) (int, error) {
	var n int
	err := f.DB.QueryRowContext(ctx, "SELECT count(*) FROM "+f.Effects+" WHERE tag = $1", tag).Scan(&n)
	return n, err
}

// Bare is the benchmarks' baseline: the effect in a plain transaction.
func (f *Fixture) Bare(ctx context.Context, tag string) error {
	tx, err := f.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f.Effect(ctx, tx, tag); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// Fill writes n completed keys in scope "fill", expiring at expiresAt, then
// ANALYZEs the table.
func (f *Fixture) Fill(ctx context.Context, n int, expiresAt time.Time) error {
	_, err := f.DB.ExecContext(ctx, `INSERT INTO `+f.Table+` (scope, id, fingerprint, state, status, header, body, created_at, expires_at)
		SELECT 'fill', 'fill-' || g, 'fp', 'completed', 201, '{"Content-Type":["application/json"]}', '{"filled":true}',
			$1::timestamptz - interval '24 hours', $1::timestamptz
		FROM generate_series(1, $2::int) g`, expiresAt, n)
	if err != nil {
		return fmt.Errorf("fill %d keys: %w", n, err)
	}
	if _, err := f.DB.ExecContext(ctx, `ANALYZE `+f.Table); err != nil {
		return fmt.Errorf("analyze after fill: %w", err)
	}
	return nil
}

// Harness is the conformance harness of a DBStore with cfg on driver's
// connections to dsn.
func Harness(driver, dsn string, cfg postgres.Config) conformance.Harness[*sql.Tx] {
	return conformance.Harness[*sql.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*sql.Tx] {
			c := cfg
			c.Clock = opts.Clock
			f := NewFixture(t, Open(t, driver, dsn, opts.MaxConns), c)
			// Another store on the same table, with connections of its own:
			// another process of the service.
			reopen := func(context.Context) (idempotency.KeyStore[*sql.Tx], error) {
				c := c
				c.Table = f.Table
				return postgres.NewDB(Open(t, driver, dsn, cmp.Or(opts.MaxConns, 4)), &c)
			}
			return conformance.Fixture[*sql.Tx]{Store: f.Store, Effect: f.Effect, Count: f.Count, Bare: f.Bare, Fill: f.Fill, Reopen: reopen}
		},
	}
}

// WithParams returns the URL dsn with the query parameters params added
// (key=value pairs), for driver or session settings.
func WithParams(t testing.TB, dsn string, params ...string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	q := u.Query()
	for _, p := range params {
		k, v, _ := strings.Cut(p, "=")
		q.Set(k, v)
	}
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	return u.String()
}

// FaultHarness is the fault suite's harness of a DBStore on driver's
// connections to dsn (a URL) through the suite's proxies, whose sessions
// end an idle transaction after idle (none if 0: then the suite runs no
// partition, which the server would hold for as long as TCP keepalives
// take).
func FaultHarness(t testing.TB, driver, dsn string, idle time.Duration) conformance.FaultHarness[*sql.Tx] {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	h := conformance.FaultHarness[*sql.Tx]{
		Upstream: u.Host,
		NewFixture: func(t testing.TB, addr, ns string) conformance.Fixture[*sql.Tx] {
			v := *u
			v.Host = addr
			var params []string
			if !v.Query().Has("connect_timeout") {
				params = append(params, "connect_timeout=2")
			}
			if idle > 0 {
				params = append(params, "idle_in_transaction_session_timeout="+strconv.Itoa(int(idle.Milliseconds())))
			}
			db := Open(t, driver, WithParams(t, v.String(), params...), 4)
			table := "faults_" + ns
			f := &Fixture{DB: db, Table: table, Effects: table + "_fx"}
			store, err := postgres.NewDB(db, &postgres.Config{Table: table})
			if err != nil {
				t.Fatal(err)
			}
			f.Store = store
			if addr == u.Host { // the fixture on the server itself creates and drops the tables
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				dropAtCleanup(t, db, false, f.Table, f.Effects, f.Table+"_quota")
				if err := store.Migrate(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+f.Effects+` (n BIGSERIAL PRIMARY KEY, tag TEXT NOT NULL)`); err != nil {
					t.Fatal(err)
				}
			}
			return conformance.Fixture[*sql.Tx]{Store: store, Effect: f.Effect, Count: f.Count}
		},
		CallTimeout: time.Second,
		Bound:       3 * time.Second,
	}
	if idle > 0 {
		h.PartitionBound = idle + 1500*time.Millisecond
	}
	return h
}

// Conformance runs the shared suite on a DBStore over driver, under each
// isolation level (the store's TxOptions, and the session's default) and
// with the look-up first: what TestConformance runs on the pgx front end.
func Conformance(t *testing.T, driver, dsn string) {
	t.Run("ReadCommitted", func(t *testing.T) {
		conformance.Run(t, Harness(driver, dsn, postgres.Config{}))
	})
	t.Run("TxOptionsSerializable", func(t *testing.T) {
		conformance.Run(t, Harness(driver, dsn, postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}))
	})
	t.Run("RepeatableRead", func(t *testing.T) {
		conformance.Run(t, Harness(driver, WithParams(t, dsn, "default_transaction_isolation=repeatable read"), postgres.Config{}))
	})
	t.Run("LookupAlways", func(t *testing.T) {
		conformance.Run(t, Harness(driver, dsn, postgres.Config{Lookup: backend.LookupAlways}))
	})
}
