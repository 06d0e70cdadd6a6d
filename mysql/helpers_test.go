package mysql

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency/internal/testenv"
)

// testConfig returns the test server's DSN, parsed, with extra applied.
func testConfig(t testing.TB, extra func(*gomysql.Config)) *gomysql.Config {
	t.Helper()
	cfg, err := gomysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatalf("parse %s: %v", testenv.MySQLEnv, err)
	}
	if extra != nil {
		extra(cfg)
	}
	if err := CheckDSN(cfg.FormatDSN()); err != nil {
		t.Fatalf("CheckDSN(test DSN): %v", err)
	}
	return cfg
}

// openDB opens a pool on cfg, capped at maxConns when > 0, closed at the
// end of the test.
func openDB(t testing.TB, cfg *gomysql.Config, maxConns int) *sql.DB {
	t.Helper()
	db, err := Open(cfg.FormatDSN())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if maxConns > 0 {
		db.SetMaxOpenConns(maxConns)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// fixture is a fresh keys table and its effects table (tag VARBINARY,
// compared byte for byte) on db, dropped at the end of the test.
type fixture struct {
	db      *sql.DB
	store   *Store
	table   string
	effects string
}

func newFixture(t testing.TB, db *sql.DB, cfg *Config) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := &fixture{db: db, table: randomName()}
	f.effects = f.table + "_effects"
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Table = f.table
	s, err := New(db, &c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.store = s
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// A pool of its own: db may be closed already, or full.
		cdb, err := Open(testConfig(t, nil).FormatDSN())
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer cdb.Close()
		for _, tb := range []string{f.table, f.effects} {
			if _, err := cdb.ExecContext(ctx, "DROP TABLE IF EXISTS `"+tb+"`"); err != nil {
				t.Errorf("cleanup: drop %s: %v", tb, err)
			}
		}
	})
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE `"+f.effects+"` (tag VARBINARY(1024) NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatalf("create effects table: %v", err)
	}
	return f
}

func randomName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "idem_test_" + hex.EncodeToString(b)
}

func (f *fixture) effect(ctx context.Context, tx *sql.Tx, tag string) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO `"+f.effects+"` (tag) VALUES (?)", []byte(tag))
	return err
}

func (f *fixture) bare(ctx context.Context, tag string) error {
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f.effect(ctx, tx, tag); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// count counts effects tagged tag through a connection of the pool.
func (f *fixture) count(ctx context.Context, tag string) (int, error) {
	var n int
	err := f.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+f.effects+"` WHERE tag = ?", []byte(tag)).Scan(&n)
	return n, err
}

func (f *fixture) mustCount(t testing.TB, ctx context.Context, tag string, want int) {
	t.Helper()
	got, err := f.count(ctx, tag)
	if err != nil {
		t.Fatalf("count %q: %v", tag, err)
	}
	if got != want {
		t.Fatalf("effects %q: got %d, want %d", tag, got, want)
	}
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// countingConnector counts the round trips its connections make: one per
// prepare, statement execution, BEGIN (two with an isolation level),
// COMMIT and ROLLBACK. Closing a prepared statement has no reply and does
// not count; neither does what the driver sends while connecting.
type countingConnector struct {
	driver.Connector
	n *atomic.Int64
}

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{inner: conn, n: c.n}, nil
}

type countingConn struct {
	inner driver.Conn
	n     *atomic.Int64
}

func (c *countingConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	c.n.Add(1)
	st, err := c.inner.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &countingStmt{inner: st, n: c.n}, nil
}

func (c *countingConn) Close() error { return c.inner.Close() }

func (c *countingConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.n.Add(1)
	if opts.Isolation != 0 {
		c.n.Add(1)
	}
	tx, err := c.inner.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &countingTx{inner: tx, n: c.n}, nil
}

func (c *countingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	res, err := c.inner.(driver.ExecerContext).ExecContext(ctx, query, args)
	if !errors.Is(err, driver.ErrSkip) {
		c.n.Add(1)
	}
	return res, err
}

func (c *countingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := c.inner.(driver.QueryerContext).QueryContext(ctx, query, args)
	if !errors.Is(err, driver.ErrSkip) {
		c.n.Add(1)
	}
	return rows, err
}

func (c *countingConn) Ping(ctx context.Context) error {
	c.n.Add(1)
	return c.inner.(driver.Pinger).Ping(ctx)
}

func (c *countingConn) ResetSession(ctx context.Context) error {
	return c.inner.(driver.SessionResetter).ResetSession(ctx)
}

func (c *countingConn) IsValid() bool { return c.inner.(driver.Validator).IsValid() }

func (c *countingConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.inner.(driver.NamedValueChecker).CheckNamedValue(nv)
}

type countingStmt struct {
	inner driver.Stmt
	n     *atomic.Int64
}

func (s *countingStmt) Close() error  { return s.inner.Close() }
func (s *countingStmt) NumInput() int { return s.inner.NumInput() }

func (s *countingStmt) Exec(args []driver.Value) (driver.Result, error) {
	s.n.Add(1)
	return s.inner.Exec(args) //nolint:staticcheck // the driver's own interface
}

func (s *countingStmt) Query(args []driver.Value) (driver.Rows, error) {
	s.n.Add(1)
	return s.inner.Query(args) //nolint:staticcheck // the driver's own interface
}

func (s *countingStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.n.Add(1)
	return s.inner.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (s *countingStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.n.Add(1)
	return s.inner.(driver.StmtQueryContext).QueryContext(ctx, args)
}

func (s *countingStmt) CheckNamedValue(nv *driver.NamedValue) error {
	return s.inner.(driver.NamedValueChecker).CheckNamedValue(nv)
}

type countingTx struct {
	inner driver.Tx
	n     *atomic.Int64
}

func (t *countingTx) Commit() error   { t.n.Add(1); return t.inner.Commit() }
func (t *countingTx) Rollback() error { t.n.Add(1); return t.inner.Rollback() }
