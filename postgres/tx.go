package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/go-idempotency/idempotency"
)

// errCommitInFn is what fn gets from Commit: the transaction also holds the
// key, and Guard.Do commits both when fn returns.
var errCommitInFn = errors.New("postgres: fn must not commit: Guard.Do commits the transaction, with the key, when fn returns")

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
		return nil, t.storeErr(ctx, err)
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
	n, err := t.inner.CopyFrom(ctx, tableName, columnNames, rowSrc)
	return n, t.storeErr(ctx, err)
}

func (t *tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return batchResults{t.inner.SendBatch(ctx, b), t, ctx}
}

func (t *tx) LargeObjects() pgx.LargeObjects { return t.inner.LargeObjects() }

func (t *tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	sd, err := t.inner.Prepare(ctx, name, sql)
	return sd, t.storeErr(ctx, err)
}

func (t *tx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	if t.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	tag, err := t.inner.Exec(ctx, sql, arguments...)
	return tag, t.storeErr(ctx, err)
}

func (t *tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed {
		return errRows{pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	rows, err := t.inner.Query(ctx, sql, args...)
	if err != nil {
		err = t.storeErr(ctx, err)
		return errRows{err}, err
	}
	return storeRows{rows, t, ctx}, nil
}

func (t *tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.closed {
		return errRows{pgx.ErrTxClosed}
	}
	return storeRow{t.inner.QueryRow(ctx, sql, args...), t, ctx}
}

func (t *tx) Conn() *pgx.Conn { return t.inner.Conn() }

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

// storeErr adds [idempotency.ErrStore] to the error of one of fn's
// statements when the connection failed under it (cut, closed by the
// server). Then the store failed, not fn's logic, and retrying the call
// with the same key is safe. An error after ctx ended is left as it is. Either
// way, a connection the driver gave up on has its socket closed at once
// (see dropIfBroken), so that the key is free while fn still runs. A
// statement of pgx's cache lost behind a transaction pooler gets
// [ErrStatementCacheBehindPooler].
func (t *tx) storeErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	err = poolerHint(err)
	pg := t.inner.Conn().PgConn()
	dropIfBroken(pg)
	if ctx.Err() != nil || errors.Is(err, idempotency.ErrStore) || !pg.IsClosed() {
		return err
	}
	return fmt.Errorf("%w: %w", idempotency.ErrStore, err)
}

// storeRows are fn's query results, whose error goes through storeErr.
type storeRows struct {
	pgx.Rows
	t   *tx
	ctx context.Context
}

func (r storeRows) Err() error { return r.t.storeErr(r.ctx, r.Rows.Err()) }

// storeRow is fn's single-row result, whose error goes through storeErr.
type storeRow struct {
	pgx.Row
	t   *tx
	ctx context.Context
}

func (r storeRow) Scan(dest ...any) error { return r.t.storeErr(r.ctx, r.Row.Scan(dest...)) }

// batchResults are fn's batch results, whose errors go through storeErr.
type batchResults struct {
	pgx.BatchResults
	t   *tx
	ctx context.Context
}

func (br batchResults) Exec() (pgconn.CommandTag, error) {
	tag, err := br.BatchResults.Exec()
	return tag, br.t.storeErr(br.ctx, err)
}

func (br batchResults) Query() (pgx.Rows, error) {
	rows, err := br.BatchResults.Query()
	if err != nil {
		return rows, br.t.storeErr(br.ctx, err)
	}
	return storeRows{rows, br.t, br.ctx}, nil
}

func (br batchResults) QueryRow() pgx.Row {
	return storeRow{br.BatchResults.QueryRow(), br.t, br.ctx}
}

func (br batchResults) Close() error { return br.t.storeErr(br.ctx, br.BatchResults.Close()) }
