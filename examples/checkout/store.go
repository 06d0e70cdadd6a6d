package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redact"
	"github.com/go-idempotency/idempotency/mysql"
	"github.com/go-idempotency/idempotency/observe"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/sqlite"
)

// tables names the service's tables.
type tables struct {
	Orders, Receipts, Outbox, Keys string
}

func newTables(prefix string) tables {
	return tables{Orders: prefix + "orders", Receipts: prefix + "receipts", Outbox: prefix + "outbox", Keys: prefix + "keys"}
}

// app is the service on one store, with what its tests look at.
type app struct {
	name    string
	handler http.Handler
	// complete runs the service's Completer until ctx ends.
	complete func(ctx context.Context, grace, interval time.Duration, logf func(string, ...any))
	// inspect returns what the store holds for key, body included.
	inspect func(ctx context.Context, key idempotency.Key) (*idempotency.KeyInfo, error)
	// stats counts the keys by state.
	stats func(ctx context.Context) (idempotency.Stats, error)
	// count runs a SELECT count(*) written with ? placeholders.
	count func(ctx context.Context, query string, args ...any) (int, error)
	close func()
}

// storeHelp lists the -store forms.
const storeHelp = `accepted -store values:
  PATH.db, PATH.sqlite, PATH.sqlite3, sqlite:PATH, file:PATH   SQLite file
  postgres://user@host:5432/db (or postgresql://)             PostgreSQL
  mysql://user:pass@host:3306/db (or user:pass@tcp(host:3306)/db)   MySQL/MariaDB`

// open connects to the store dsn names, creates the tables if needed and
// builds the service on it.
func open(ctx context.Context, dsn string, names tables, cfg config, pause *pauser) (*app, error) {
	scheme, _, hasScheme := strings.Cut(dsn, "://")
	switch {
	case hasScheme && (scheme == "postgres" || scheme == "postgresql"):
		return openPostgres(ctx, dsn, names, cfg, pause)
	case hasScheme && scheme == "mysql", !hasScheme && strings.Contains(dsn, "@tcp("), !hasScheme && strings.Contains(dsn, "@unix("):
		return openMySQL(ctx, dsn, names, cfg, pause)
	case hasScheme && (scheme == "redis" || scheme == "rediss"):
		return nil, fmt.Errorf("-store %s: Redis cannot run this service: an operation's steps commit with the service's rows (orders, receipts, outbox) in one transaction of the store, and no transaction spans Redis and a database\n%s", scheme+"://...", storeHelp)
	case hasScheme && scheme == "file":
		return openSQLite(ctx, strings.TrimPrefix(dsn, "file://"), names, cfg, pause)
	case hasScheme:
		return nil, fmt.Errorf("-store: unknown scheme %q\n%s", scheme, storeHelp)
	case strings.HasPrefix(dsn, "sqlite:"), strings.HasPrefix(dsn, "file:"):
		_, path, _ := strings.Cut(dsn, ":")
		return openSQLite(ctx, path, names, cfg, pause)
	}
	for _, suf := range []string{".db", ".sqlite", ".sqlite3"} {
		if strings.HasSuffix(strings.ToLower(dsn), suf) && len(dsn) > len(suf) {
			return openSQLite(ctx, dsn, names, cfg, pause)
		}
	}
	return nil, fmt.Errorf("-store %q: not a recognised store\n%s", redact.DSN(dsn), storeHelp)
}

// build makes the app of the generic parts: the Guard, the service and
// its Completer.
func build[Tx any](store idempotency.KeyStore[Tx], adapt func(Tx) db, names tables, cfg config, pause *pauser) (*app, error) {
	logf := cfg.logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	g, err := idempotency.New(store, &idempotency.Config{Observer: logEvent(logf)})
	if err != nil {
		return nil, err
	}
	// A store without operations (no Stepper) is refused here, before
	// the service listens.
	s, err := newService(g, adapt, names, cfg, pause)
	if err != nil {
		return nil, err
	}
	return &app{
		handler: s,
		complete: func(ctx context.Context, grace, interval time.Duration, logf func(string, ...any)) {
			c, err := idempotency.NewCompleter(g, &idempotency.CompleterConfig{Grace: grace, Interval: interval}, s.op)
			if err != nil {
				logf("completer: %v", err)
				return
			}
			complete(ctx, c, interval, logf)
		},
		inspect: func(ctx context.Context, key idempotency.Key) (*idempotency.KeyInfo, error) {
			return g.Inspect(ctx, key, true)
		},
		stats: g.Stats,
	}, nil
}

// logEvent is an Observer that logs every run of the operation: the key
// by its hash, how the run ended and at which step.
func logEvent(logf func(string, ...any)) observe.Observer {
	return func(_ context.Context, ev observe.Event) {
		if ev.Err != nil {
			logf("run %v: %v at step %q: %v", ev.Key, ev.Outcome, ev.Step, ev.Err)
			return
		}
		logf("run %v: %v (%v)", ev.Key, ev.Outcome, ev.Duration.Round(time.Millisecond))
	}
}

// sqlDB is a db on a *sql.Tx (SQLite, MySQL).
type sqlDB struct {
	tx *sql.Tx
	ob *outbox.Outbox
}

func (d sqlDB) Exec(ctx context.Context, query string, args ...any) error {
	_, err := d.tx.ExecContext(ctx, query, args...)
	return err
}

func (d sqlDB) WriteEvent(ctx context.Context, ev outbox.Event) error {
	return d.ob.WriteSQL(ctx, d.tx, ev)
}

// pgxDB is a db on a pgx.Tx (PostgreSQL).
type pgxDB struct {
	tx pgx.Tx
	ob *outbox.Outbox
}

func (d pgxDB) Exec(ctx context.Context, query string, args ...any) error {
	_, err := d.tx.Exec(ctx, numbered(query), args...)
	return err
}

func (d pgxDB) WriteEvent(ctx context.Context, ev outbox.Event) error {
	return d.ob.Write(ctx, d.tx, ev)
}

// numbered rewrites the ? placeholders of query as $1, $2, ... (the
// service's queries hold no other question mark).
func numbered(query string) string {
	var b strings.Builder
	n := 0
	for _, c := range query {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// schema is the DDL of the service's own tables, valid on the three
// stores.
func schema(names tables) []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + names.Orders + ` (
	id       VARCHAR(64) PRIMARY KEY,
	key_hash VARCHAR(16) NOT NULL,
	amount   BIGINT NOT NULL,
	email    VARCHAR(255) NOT NULL,
	status   VARCHAR(16) NOT NULL
)`,
		`CREATE TABLE IF NOT EXISTS ` + names.Receipts + ` (
	order_id  VARCHAR(64) NOT NULL,
	key_hash  VARCHAR(16) NOT NULL,
	charge_id VARCHAR(64) NOT NULL,
	amount    BIGINT NOT NULL
)`,
	}
}

func openSQLite(ctx context.Context, path string, names tables, cfg config, pause *pauser) (*app, error) {
	sdb, err := sqlite.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	st, err := sqlite.New(sdb, &sqlite.Config{Table: names.Keys})
	if err != nil {
		sdb.Close()
		return nil, err
	}
	a, err := setupSQL(ctx, sdb, outbox.SQLite, names, st, st.Migrate, cfg, pause)
	if err != nil {
		st.Close()
		sdb.Close()
		return nil, err
	}
	a.name = "sqlite:" + path
	a.close = func() { st.Close(); sdb.Close() }
	return a, nil
}

func openMySQL(ctx context.Context, dsn string, names tables, cfg config, pause *pauser) (*app, error) {
	sdb, err := mysql.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	st, err := mysql.New(sdb, &mysql.Config{Table: names.Keys})
	if err != nil {
		sdb.Close()
		return nil, err
	}
	a, err := setupSQL(ctx, sdb, outbox.MySQL, names, st, st.Migrate, cfg, pause)
	if err != nil {
		sdb.Close()
		return nil, err
	}
	a.name = "mysql"
	return a, nil
}

// setupSQL builds the service on a database/sql store (SQLite, MySQL).
func setupSQL(ctx context.Context, sdb *sql.DB, d outbox.Dialect, names tables, store idempotency.KeyStore[*sql.Tx], migrate func(context.Context) error, cfg config, pause *pauser) (*app, error) {
	if err := migrate(ctx); err != nil {
		return nil, err
	}
	ob, err := outbox.New(d, &outbox.Config{Table: names.Outbox})
	if err != nil {
		return nil, err
	}
	if err := ob.Migrate(ctx, sdb); err != nil {
		return nil, err
	}
	for _, stmt := range schema(names) {
		if _, err := sdb.ExecContext(ctx, stmt); err != nil {
			return nil, fmt.Errorf("create the service's tables: %w", err)
		}
	}
	a, err := build(store, func(tx *sql.Tx) db { return sqlDB{tx, ob} }, names, cfg, pause)
	if err != nil {
		return nil, err
	}
	a.count = func(ctx context.Context, query string, args ...any) (n int, err error) {
		err = sdb.QueryRowContext(ctx, query, args...).Scan(&n)
		return n, err
	}
	a.close = func() { sdb.Close() }
	return a, nil
}

func openPostgres(ctx context.Context, dsn string, names tables, cfg config, pause *pauser) (*app, error) {
	pool, err := postgres.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	a, err := setupPostgres(ctx, pool, names, cfg, pause)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return a, nil
}

func setupPostgres(ctx context.Context, pool *pgxpool.Pool, names tables, cfg config, pause *pauser) (*app, error) {
	store, err := postgres.New(pool, &postgres.Config{Table: names.Keys})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	ob, err := outbox.New(outbox.Postgres, &outbox.Config{Table: names.Outbox})
	if err != nil {
		return nil, err
	}
	if err := ob.MigratePgx(ctx, pool); err != nil {
		return nil, err
	}
	for _, stmt := range schema(names) {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			return nil, fmt.Errorf("create the service's tables: %w", err)
		}
	}
	a, err := build(store, func(tx pgx.Tx) db { return pgxDB{tx, ob} }, names, cfg, pause)
	if err != nil {
		return nil, err
	}
	a.name = "postgres"
	a.count = func(ctx context.Context, query string, args ...any) (n int, err error) {
		err = pool.QueryRow(ctx, numbered(query), args...).Scan(&n)
		return n, err
	}
	a.close = pool.Close
	return a, nil
}
