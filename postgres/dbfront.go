package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/go-idempotency/idempotency"
)

// The database/sql front end of the store's mechanism (see link.go). The
// statements and their order are the pgx front end's; database/sql sends
// each on its own (it has no pipeline), and a transaction is an *sql.Tx,
// begun and ended through database/sql rather than by SQL text. So the
// link reads the BEGIN, ROLLBACK and COMMIT of a batch as calls of
// database/sql, and runs its other statements one at a time, in the
// transaction once one is begun. Arguments are converted to what every
// driver sends (see sqlArgs) and rows scanned through the same
// destinations (see scanSQL).

// sqlLink is a link on a *sql.DB: the connection is the one database/sql
// gives the transaction, from BEGIN to its end.
type sqlLink struct {
	s  *Store
	db *sql.DB
	tx *sql.Tx // the open transaction, nil outside one
}

func (l *sqlLink) send(ctx context.Context, b *pgx.Batch) results {
	return &sqlResults{l: l, ctx: ctx, queued: b.QueuedQueries}
}

func (l *sqlLink) queryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return sqlRow{l.db.QueryRowContext(ctx, query, sqlArgs(args)...)}
}

func (l *sqlLink) rollbackNow(context.Context) error {
	tx := l.tx
	l.tx = nil
	if tx == nil {
		return nil
	}
	return tx.Rollback()
}

func (l *sqlLink) noteBackend(uint32) {} // the driver chooses how statements travel

func (l *sqlLink) began() {}

// ending fails only if no transaction is open; a transaction fn ended or
// aborted fails the batch instead (see finishError).
func (l *sqlLink) ending(key idempotency.Key) error {
	if l.tx == nil {
		return fmt.Errorf("postgres: key %v: %w", key, sql.ErrTxDone)
	}
	return nil
}

// rollback ignores the error of a driver that gave the connection up
// because ctx ended (pgx's stdlib closes it; lib/pq reports
// driver.ErrBadConn and database/sql closes it): closing the connection
// ends the server's transaction too, and frees the key. With ctx alive,
// such an error says the connection failed under fn, and is returned: the
// core then adds [idempotency.ErrStore] to fn's error.
func (l *sqlLink) rollback(ctx context.Context, key idempotency.Key) error {
	err := l.rollbackNow(nil)
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, driver.ErrBadConn)) {
		return nil
	}
	if err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("postgres: rollback key %v: %w", key, err)
	}
	return nil
}

// abandon rolls back: database/sql then returns the connection to its
// pool, or closes it if the ROLLBACK failed.
func (l *sqlLink) abandon(context.Context) { _ = l.rollbackNow(nil) }

// run runs one queued statement: BEGIN, ROLLBACK and COMMIT as calls of
// database/sql, any other statement in the open transaction, or outside
// any if none is open.
func (l *sqlLink) run(ctx context.Context, q *pgx.QueuedQuery) (pgconn.CommandTag, error) {
	switch q.SQL {
	case l.s.beginSQL, beginReadCommitted:
		opts := l.s.sqlTxOptions
		if q.SQL == beginReadCommitted {
			opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
		}
		tx, err := l.db.BeginTx(ctx, opts)
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		l.tx = tx
		return pgconn.NewCommandTag("BEGIN"), nil
	case "rollback":
		return pgconn.NewCommandTag("ROLLBACK"), l.rollbackNow(ctx)
	case "commit":
		tx := l.tx
		l.tx = nil
		if tx == nil {
			return pgconn.CommandTag{}, sql.ErrTxDone
		}
		return pgconn.NewCommandTag("COMMIT"), tx.Commit()
	}
	return execSQL(ctx, l.conn(), q.SQL, q.Arguments)
}

// sqlConn is a *sql.DB or a *sql.Tx.
type sqlConn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// conn is the open transaction, or the *sql.DB outside one.
func (l *sqlLink) conn() sqlConn {
	if l.tx != nil {
		return l.tx
	}
	return l.db
}

// execSQL runs one statement of the store on c and returns a command tag
// that carries the rows it affected.
func execSQL(ctx context.Context, c sqlConn, query string, args []any) (pgconn.CommandTag, error) {
	res, err := c.ExecContext(ctx, query, sqlArgs(args)...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return pgconn.NewCommandTag("EXEC " + strconv.FormatInt(n, 10)), nil
}

// sqlResults are the results of a sqlLink's batch: each statement runs
// when its result is read, none after the first error, as in a pipeline.
type sqlResults struct {
	l      *sqlLink
	ctx    context.Context
	queued []*pgx.QueuedQuery
	next   int
	err    error // the first error
}

func (r *sqlResults) pop() (*pgx.QueuedQuery, error) {
	if r.err != nil {
		return nil, r.err
	}
	if r.next >= len(r.queued) {
		return nil, errors.New("postgres: no more results in batch")
	}
	r.next++
	return r.queued[r.next-1], nil
}

func (r *sqlResults) Exec() (pgconn.CommandTag, error) {
	q, err := r.pop()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := r.l.run(r.ctx, q)
	r.err = err
	return tag, err
}

func (r *sqlResults) QueryRow() pgx.Row {
	q, err := r.pop()
	if err != nil {
		return errRows{err}
	}
	return batchRow{sqlRow{r.l.conn().QueryRowContext(r.ctx, q.SQL, sqlArgs(q.Arguments)...)}, r}
}

func (r *sqlResults) Close() error { return r.err }

// batchRow is a row of a batch, whose error stops the batch.
type batchRow struct {
	sqlRow
	r *sqlResults
}

func (b batchRow) Scan(dest ...any) error {
	err := b.sqlRow.Scan(dest...)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		b.r.err = err
	}
	return err
}

// sqlRow is a *sql.Row read as a pgx.Row.
type sqlRow struct{ row *sql.Row }

func (r sqlRow) Scan(dest ...any) error {
	err := scanSQL(r.row.Scan, dest)
	if errors.Is(err, sql.ErrNoRows) {
		return pgx.ErrNoRows
	}
	return err
}

// sqlRows are *sql.Rows read as the querier's rows.
type sqlRows struct{ rows *sql.Rows }

func (r sqlRows) Next() bool             { return r.rows.Next() }
func (r sqlRows) Scan(dest ...any) error { return scanSQL(r.rows.Scan, dest) }
func (r sqlRows) Err() error             { return r.rows.Err() }
func (r sqlRows) Close()                 { _ = r.rows.Close() }

// scanSQL scans with scan into the store's destinations: a nil one skips
// its column, and a ctid is read from its text form (drivers that do not
// know the tid type return it as text).
func scanSQL(scan func(...any) error, dest []any) error {
	d := make([]any, len(dest))
	var tids []func() error
	for i, x := range dest {
		switch x := x.(type) {
		case nil:
			d[i] = new(any)
		case *pgtype.TID:
			var text sql.NullString
			d[i] = &text
			tids = append(tids, func() error {
				if !text.Valid {
					*x = pgtype.TID{}
					return nil
				}
				return x.Scan(text.String)
			})
		default:
			d[i] = x
		}
	}
	if err := scan(d...); err != nil {
		return err
	}
	for _, f := range tids {
		if err := f(); err != nil {
			return fmt.Errorf("postgres: ctid: %w", err)
		}
	}
	return nil
}

// sqlArgs converts the store's arguments to values every driver sends as
// the statements' casts expect: the pgx exec mode is dropped, a
// time.Duration (an interval parameter) is sent as an interval's text in
// microseconds, as pgx encodes it, and a ctid as its text.
func sqlArgs(args []any) []any {
	if len(args) > 0 {
		if _, ok := args[0].(pgx.QueryExecMode); ok {
			args = args[1:]
		}
	}
	out := make([]any, len(args))
	for i, a := range args {
		switch a := a.(type) {
		case time.Duration:
			out[i] = strconv.FormatInt(a.Microseconds(), 10) + " microseconds"
		case pgtype.TID:
			v, _ := a.Value() // a valid TID always encodes
			out[i] = v
		default:
			out[i] = a
		}
	}
	return out
}

// sqlQuerier is the querier of [DBStore]: its *sql.DB.
type sqlQuerier struct{ db *sql.DB }

func (q sqlQuerier) exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	return execSQL(ctx, q.db, query, args)
}

func (q sqlQuerier) queryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return sqlRow{q.db.QueryRowContext(ctx, query, sqlArgs(args)...)}
}

func (q sqlQuerier) query(ctx context.Context, query string, args ...any) (rows, error) {
	r, err := q.db.QueryContext(ctx, query, sqlArgs(args)...)
	if err != nil {
		return nil, err
	}
	return sqlRows{r}, nil
}
