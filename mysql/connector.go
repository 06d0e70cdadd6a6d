package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
)

// connector wraps the driver's connector for the pools [Open] returns. With
// it a [Store] saves two round trips per new key on MariaDB. The START
// TRANSACTION of its transaction travels with the reservation, and the
// COMMIT with the stored response (see "Round trips" in the package
// documentation). Every other use of the pool goes to the driver as it is.
type connector struct {
	inner driver.Connector
	// interpolate: the driver interpolates arguments into the statement
	// text, which the folded statements need.
	interpolate bool
}

// Connect implements driver.Connector.
func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	ci, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &foldConn{inner: ci, interpolate: c.interpolate}, nil
}

// Driver implements driver.Connector.
func (c *connector) Driver() driver.Driver { return c.inner.Driver() }

// foldConn is a driver connection of a connector. Only a Store, through
// sql.Conn.Raw, asks it to defer a BeginTx. Each such transaction is then
// begun and ended by the Store's own statements. Its Commit or Rollback
// sends nothing unless the server may still have it open.
type foldConn struct {
	inner       driver.Conn
	interpolate bool
	// deferBegin: the next BeginTx sends nothing (set by deferBegin).
	deferBegin bool
	// open: the deferred transaction may be open on the server; the
	// Store clears it once a statement of its own committed it.
	open bool
}

var (
	errNotDriverConn = errors.New("mysql: the driver connection does not support a needed interface")
	errTxEnded       = errors.New("mysql: the transaction was ended before Complete (by fn?)")
)

// deferBegin asks conn's driver connection to send nothing for the next
// BeginTx, when it is a connector's (opened by Open) that interpolates
// arguments. The caller then sends START TRANSACTION itself, in its first
// statement. Any other call of the driver connection clears the
// request. It reports whether the request was taken.
func deferBegin(conn *sql.Conn) bool {
	taken := false
	_ = conn.Raw(func(dc any) error {
		if c, ok := dc.(*foldConn); ok && c.interpolate {
			c.deferBegin, taken = true, true
		}
		return nil
	})
	return taken
}

// execCommitting runs query with args straight on conn's driver connection
// (a foldConn, with a transaction whose BeginTx was deferred). The query
// is a statement that ends with COMMIT. Once it succeeds the transaction
// is over, and its Commit sends nothing. It reports driver.ErrSkip when
// the driver cannot send query as it is (not a foldConn, or the statement
// is too large to interpolate): nothing was sent then.
func execCommitting(ctx context.Context, conn *sql.Conn, query string, args []driver.NamedValue) error {
	var err error
	// The callback never returns an error: one that said ErrBadConn would
	// make Raw close conn while the transaction holds it.
	_ = conn.Raw(func(dc any) error {
		c, ok := dc.(*foldConn)
		if !ok {
			err = driver.ErrSkip
			return nil
		}
		if !c.open {
			// fn ended the transaction (Commit or Rollback of its *sql.Tx):
			// nothing may be committed now.
			err = errTxEnded
			return nil
		}
		if _, err = c.ExecContext(ctx, query, args); err == nil {
			c.open = false
		}
		return nil
	})
	return err
}

// lazyTx is a transaction whose START TRANSACTION a Store sends itself.
type lazyTx struct{ c *foldConn }

// Commit sends COMMIT unless the Store's statements committed the
// transaction already.
func (t lazyTx) Commit() error { return t.c.end("COMMIT") }

// Rollback sends ROLLBACK unless the Store's statements committed the
// transaction already.
func (t lazyTx) Rollback() error { return t.c.end("ROLLBACK") }

func (c *foldConn) end(query string) error {
	if !c.open {
		return nil
	}
	c.open = false
	_, err := c.ExecContext(context.Background(), query, nil)
	return err
}

// Begin implements driver.Conn.
func (c *foldConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx implements driver.ConnBeginTx.
func (c *foldConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.deferBegin {
		// The Store's first statement begins the transaction; from here
		// on it may be open on the server.
		c.deferBegin = false
		c.open = true
		return lazyTx{c}, nil
	}
	bt, ok := c.inner.(driver.ConnBeginTx)
	if !ok {
		return nil, errNotDriverConn
	}
	return bt.BeginTx(ctx, opts)
}

// Prepare implements driver.Conn.
func (c *foldConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext implements driver.ConnPrepareContext.
func (c *foldConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	c.deferBegin = false
	if p, ok := c.inner.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, query)
	}
	return c.inner.Prepare(query)
}

// ExecContext implements driver.ExecerContext.
func (c *foldConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	c.deferBegin = false
	e, ok := c.inner.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	return e.ExecContext(ctx, query, args)
}

// QueryContext implements driver.QueryerContext.
func (c *foldConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	c.deferBegin = false
	q, ok := c.inner.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	return q.QueryContext(ctx, query, args)
}

// Close implements driver.Conn.
func (c *foldConn) Close() error { return c.inner.Close() }

// Ping implements driver.Pinger.
func (c *foldConn) Ping(ctx context.Context) error {
	if p, ok := c.inner.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// ResetSession implements driver.SessionResetter.
func (c *foldConn) ResetSession(ctx context.Context) error {
	c.deferBegin = false
	if c.open {
		// A deferred transaction database/sql let go of without ending it
		// (cannot happen through a Store): the session is unknown.
		return driver.ErrBadConn
	}
	if r, ok := c.inner.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

// IsValid implements driver.Validator.
func (c *foldConn) IsValid() bool {
	if v, ok := c.inner.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

// CheckNamedValue implements driver.NamedValueChecker.
func (c *foldConn) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := c.inner.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// Exec passes an Exec of code that type-asserts the connection from
// sql.Conn.Raw to the driver's (deprecated) driver.Execer.
func (c *foldConn) Exec(query string, args []driver.Value) (driver.Result, error) {
	c.deferBegin = false
	//lint:ignore SA1019 kept for code that calls it through sql.Conn.Raw
	e, ok := c.inner.(driver.Execer)
	if !ok {
		return nil, driver.ErrSkip
	}
	return e.Exec(query, args)
}

// Query passes a Query of code that type-asserts the connection from
// sql.Conn.Raw to the driver's (deprecated) driver.Queryer.
func (c *foldConn) Query(query string, args []driver.Value) (driver.Rows, error) {
	c.deferBegin = false
	//lint:ignore SA1019 kept for code that calls it through sql.Conn.Raw
	q, ok := c.inner.(driver.Queryer)
	if !ok {
		return nil, driver.ErrSkip
	}
	return q.Query(query, args)
}
