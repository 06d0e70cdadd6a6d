package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
)

// The store's mechanism (its statements, their order, what it makes of
// their results) is written once, over two small interfaces that each
// front end implements: a link is the one connection of a reservation, a
// phase or Forget; a querier runs the single autocommit statements of
// Purge, the admin, quota and schema calls. [Store] implements them with
// pgx (a batch is one round trip); [DBStore] with database/sql (one round
// trip per statement, see dbfront.go).

// link is the connection on which the store sends the statements of one
// reservation (or phase, or Forget), and which holds its transaction.
type link interface {
	// send sends b's statements in order; their results are read in order.
	// A statement after a failed one is not run. A batch may begin with
	// the BEGIN of Batch.BeginTx (the store's TxOptions), or with
	// beginReadCommitted, and may end with ROLLBACK or the store's COMMIT.
	send(ctx context.Context, b *pgx.Batch) results
	// queryRow runs one statement outside any transaction.
	queryRow(ctx context.Context, sql string, args ...any) pgx.Row
	// rollbackNow ends the transaction the link is in, with its own
	// round trip, before the store begins another on it.
	rollbackNow(ctx context.Context) error
	// noteBackend records the server process id the lock statement
	// reported (see noteBackend).
	noteBackend(pid uint32)
	// began makes the transaction the last batch began fn's.
	began()
	// ending is called before the batch that ends the transaction: it
	// marks fn's transaction closed for good and fails if fn ended or
	// aborted it, where the front end can tell without a round trip.
	ending(key idempotency.Key) error
	// rollback abandons the transaction and releases the connection,
	// even with a cancelled ctx.
	rollback(ctx context.Context, key idempotency.Key) error
	// abandon ends whatever transaction the link is in and releases it.
	abandon(ctx context.Context)
}

// beginReadCommitted is the BEGIN of Forget's transaction.
const beginReadCommitted = "begin isolation level read committed"

// results are the results of link.send, read in order.
type results interface {
	Exec() (pgconn.CommandTag, error)
	QueryRow() pgx.Row
	Close() error
}

// rows are the rows of querier.query.
type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// querier runs the store's single autocommit statements. The pgx front
// end passes its arguments as they are (a leading pgx.QueryExecMode
// included); the database/sql one drops that mode.
type querier interface {
	exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	queryRow(ctx context.Context, sql string, args ...any) pgx.Row
	query(ctx context.Context, sql string, args ...any) (rows, error)
}

// pgxQuerier is the querier of [Store]: its pool.
type pgxQuerier struct{ pool *pgxpool.Pool }

func (q pgxQuerier) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return q.pool.Exec(ctx, sql, args...)
}

func (q pgxQuerier) queryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return q.pool.QueryRow(ctx, sql, args...)
}

func (q pgxQuerier) query(ctx context.Context, sql string, args ...any) (rows, error) {
	return q.pool.Query(ctx, sql, args...)
}

// connect returns a link for one reservation, phase or Forget.
func (s *Store) connect(ctx context.Context) (link, error) {
	if s.db != nil {
		return &sqlLink{s: s, db: s.db}, nil
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, s.mapError(ctx, fmt.Errorf("postgres: acquire: %w", err), false)
	}
	return &pgxLink{s: s, conn: conn}, nil
}

// pgxLink is a link on a connection acquired from the pool: a batch is one
// round trip (see send.go).
type pgxLink struct {
	s    *Store
	conn *pgxpool.Conn
	last storeResults
	tx   *tx // fn's transaction, once began
}

func (l *pgxLink) send(ctx context.Context, b *pgx.Batch) results {
	l.last = l.s.send(ctx, l.conn.Conn(), b)
	return l.last
}

func (l *pgxLink) queryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if !direct(l.conn.Conn()) {
		args = append([]any{execMode}, args...) // else the pool's own exec mode is safe
	}
	return l.conn.QueryRow(ctx, sql, args...)
}

func (l *pgxLink) rollbackNow(ctx context.Context) error {
	_, err := l.conn.Exec(ctx, "rollback")
	return err
}

func (l *pgxLink) noteBackend(pid uint32) { noteBackend(l.conn.Conn(), pid) }

func (l *pgxLink) began() { l.tx = &tx{inner: l.last.Tx()} }

func (l *pgxLink) ending(key idempotency.Key) error {
	if l.tx.closed {
		return fmt.Errorf("postgres: key %v: fn rolled the transaction back: %w", key, pgx.ErrTxClosed)
	}
	l.tx.closed = true
	switch l.conn.Conn().PgConn().TxStatus() {
	case 'T':
		return nil
	case 'E':
		return fmt.Errorf("postgres: key %v: a statement of fn failed, the transaction is aborted: %w", key, pgx.ErrTxCommitRollback)
	}
	return fmt.Errorf("postgres: key %v: the transaction was ended inside fn: %w", key, pgx.ErrTxClosed)
}

func (l *pgxLink) rollback(ctx context.Context, key idempotency.Key) error {
	l.tx.closed = true
	defer release(l.conn)
	pg := l.conn.Conn().PgConn()
	if pg.IsClosed() || pg.TxStatus() == 'I' {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	// The driver's Rollback closes the connection if it fails, so the pool
	// never gets it back in a transaction.
	if err := l.tx.inner.Rollback(rctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("postgres: rollback key %v: %w", key, err)
	}
	return nil
}

func (l *pgxLink) abandon(ctx context.Context) { abandon(ctx, l.conn) }

// pgxTxn is a reservation of [Store], whose fn gets a [pgx.Tx].
type pgxTxn struct{ *txn }

func (t pgxTxn) Tx() pgx.Tx { return t.l.(*pgxLink).tx }

// pgxPhase is a phase of [Store], whose fn gets a [pgx.Tx].
type pgxPhase struct{ *phase }

func (p pgxPhase) Tx() pgx.Tx { return p.l.(*pgxLink).tx }
