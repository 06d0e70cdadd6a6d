package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
)

// errCommitInFn is what fn gets from Commit: the transaction also holds the
// key, and Guard.Do commits both when fn returns.
var errCommitInFn = errors.New("postgres: fn must not commit: Guard.Do commits the transaction, with the key, when fn returns")

// txn is a key held in an open transaction on one acquired connection.
type txn struct {
	s    *Store
	conn *pgxpool.Conn
	tx   *tx
	key  idempotency.Key
	row  pgtype.TID // the key row, reserved by this transaction
	done bool
}

func (t *txn) Tx() pgx.Tx { return t.tx }

// Complete stores resp on the key row and commits, in one round trip.
func (t *txn) Complete(ctx context.Context, resp idempotency.Response, expiresAt time.Time) (err error) {
	if t.done {
		return fmt.Errorf("postgres: key %q: %w", t.key.ID, pgx.ErrTxClosed)
	}
	t.done = true
	defer abandon(ctx, t.conn)
	if t.tx.closed {
		return fmt.Errorf("postgres: key %q: fn rolled the transaction back: %w", t.key.ID, pgx.ErrTxClosed)
	}
	t.tx.closed = true
	switch t.conn.Conn().PgConn().TxStatus() {
	case 'T':
	case 'E':
		return fmt.Errorf("postgres: key %q: a statement of fn failed, the transaction is aborted: %w", t.key.ID, pgx.ErrTxCommitRollback)
	default:
		return fmt.Errorf("postgres: key %q: the transaction was ended inside fn: %w", t.key.ID, pgx.ErrTxClosed)
	}
	b := &pgx.Batch{}
	b.Queue(t.s.completeSQL, t.row, t.key.Scope, t.key.ID, resp.Status, idempotency.MarshalHeader(resp.Header), resp.Body,
		expiresAt.Truncate(time.Microsecond))
	b.Queue(t.s.commitSQL)
	br := t.conn.SendBatch(ctx, b)
	var updated, committed pgconn.CommandTag
	updated, err = br.Exec()
	if err == nil {
		committed, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		// An error before COMMIT skipped it: abandon rolls back.
		return classify(ctx, fmt.Errorf("postgres: complete key %q: %w", t.key.ID, err), false)
	case committed.String() == "ROLLBACK":
		return fmt.Errorf("postgres: complete key %q: %w", t.key.ID, pgx.ErrTxCommitRollback)
	case updated.RowsAffected() != 1:
		return fmt.Errorf("postgres: complete key %q: its pending row was gone (changed through tx inside fn?); fn's effects were committed without it", t.key.ID)
	}
	return nil
}

// Rollback abandons the transaction and releases the connection, even with
// a cancelled ctx.
func (t *txn) Rollback(ctx context.Context) error {
	if t.done {
		return nil
	}
	t.done = true
	t.tx.closed = true
	defer t.conn.Release()
	pg := t.conn.Conn().PgConn()
	if pg.IsClosed() || pg.TxStatus() == 'I' {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	// The driver's Rollback closes the connection if it fails, so the pool
	// never gets it back in a transaction.
	if err := t.tx.inner.Rollback(rctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("postgres: rollback key %q: %w", t.key.ID, err)
	}
	return nil
}

// tx is the pgx.Tx fn receives: the driver's transaction, closed for good
// once the reservation ends, and whose Commit is refused (see the package
// documentation).
type tx struct {
	inner      pgx.Tx
	closed     bool
	savepoints int64
}

var _ pgx.Tx = (*tx)(nil)

// Begin starts a pseudo nested transaction implemented with a savepoint.
func (t *tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	t.savepoints++
	sp := &savepoint{tx: t, n: t.savepoints}
	if _, err := t.inner.Exec(ctx, "savepoint sp_"+strconv.FormatInt(sp.n, 10)); err != nil {
		return nil, err
	}
	return sp, nil
}

// Commit refuses: the transaction is committed when fn returns.
func (t *tx) Commit(context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	return errCommitInFn
}

// Rollback rolls the transaction back, the key and effects with it; the
// call of Do then fails.
func (t *tx) Rollback(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.closed = true
	return t.inner.Rollback(ctx)
}

func (t *tx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if t.closed {
		return 0, pgx.ErrTxClosed
	}
	return t.inner.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (t *tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return t.inner.SendBatch(ctx, b)
}

func (t *tx) LargeObjects() pgx.LargeObjects { return t.inner.LargeObjects() }

func (t *tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	return t.inner.Prepare(ctx, name, sql)
}

func (t *tx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	if t.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.inner.Exec(ctx, sql, arguments...)
}

func (t *tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed {
		return errRows{pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return t.inner.Query(ctx, sql, args...)
}

func (t *tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.closed {
		return errRows{pgx.ErrTxClosed}
	}
	return t.inner.QueryRow(ctx, sql, args...)
}

func (t *tx) Conn() *pgx.Conn { return t.inner.Conn() }

// savepoint is a pseudo nested transaction of tx, like pgx's own.
type savepoint struct {
	tx     *tx
	n      int64
	closed bool
}

var _ pgx.Tx = (*savepoint)(nil)

func (sp *savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	if sp.closed {
		return nil, pgx.ErrTxClosed
	}
	return sp.tx.Begin(ctx)
}

// Commit releases the savepoint.
func (sp *savepoint) Commit(ctx context.Context) error {
	if sp.closed {
		return pgx.ErrTxClosed
	}
	_, err := sp.Exec(ctx, "release savepoint sp_"+strconv.FormatInt(sp.n, 10))
	sp.closed = true
	return err
}

// Rollback rolls back to the savepoint.
func (sp *savepoint) Rollback(ctx context.Context) error {
	if sp.closed {
		return pgx.ErrTxClosed
	}
	_, err := sp.Exec(ctx, "rollback to savepoint sp_"+strconv.FormatInt(sp.n, 10))
	sp.closed = true
	return err
}

func (sp *savepoint) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if sp.closed {
		return 0, pgx.ErrTxClosed
	}
	return sp.tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (sp *savepoint) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if sp.closed {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return sp.tx.SendBatch(ctx, b)
}

func (sp *savepoint) LargeObjects() pgx.LargeObjects { return sp.tx.LargeObjects() }

func (sp *savepoint) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if sp.closed {
		return nil, pgx.ErrTxClosed
	}
	return sp.tx.Prepare(ctx, name, sql)
}

func (sp *savepoint) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	if sp.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return sp.tx.Exec(ctx, sql, arguments...)
}

func (sp *savepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if sp.closed {
		return errRows{pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return sp.tx.Query(ctx, sql, args...)
}

func (sp *savepoint) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if sp.closed {
		return errRows{pgx.ErrTxClosed}
	}
	return sp.tx.QueryRow(ctx, sql, args...)
}

func (sp *savepoint) Conn() *pgx.Conn { return sp.tx.Conn() }

// errRows is the closed pgx.Rows (and pgx.Row) of a closed transaction.
type errRows struct{ err error }

func (r errRows) Close()                                       {}
func (r errRows) Err() error                                   { return r.err }
func (r errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                            { return r.err }
func (r errRows) Values() ([]any, error)                       { return nil, r.err }
func (r errRows) RawValues() [][]byte                          { return nil }
func (r errRows) Conn() *pgx.Conn                              { return nil }
func (r errRows) TypeMap() *pgtype.Map                         { return nil }
