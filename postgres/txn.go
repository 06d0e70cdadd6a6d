package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// txn is a key held in an open transaction on one link: by the key's
// advisory lock, and under REPEATABLE READ and SERIALIZABLE by a pending
// row too. Each front end wraps it with the Tx its fn receives (pgxTxn,
// sqlTxn).
type txn struct {
	s       *Store
	l       link
	key     idempotency.Key
	fp      string
	now     any           // the reservation's test clock reading, nil for the server's clock
	ttl     time.Duration // the completed record's, counted from completion
	expired bool          // the look-up found an expired row of the key
	row     pgtype.TID    // the pending row, if reserveRow wrote one
	done    bool
}

// Complete writes the completed key row (or completes the pending one) and
// commits, in one round trip.
func (t *txn) Complete(ctx context.Context, resp idempotency.Response) error {
	header := backend.MarshalHeader(resp.Header)
	return t.finish(ctx, "complete", func(b *pgx.Batch, now any) {
		switch {
		case t.row.Valid:
			b.Queue(t.s.sql.complete, t.row, t.key.Scope, t.key.ID, resp.Status, header, resp.Body, now, t.ttl)
		case t.expired:
			b.Queue(t.s.sql.deleteExpired, t.key.Scope, t.key.ID, t.now)
			fallthrough
		default:
			b.Queue(t.s.sql.insert, t.key.Scope, t.key.ID, t.fp, resp.Status, header, resp.Body, t.now, now, t.ttl)
		}
	})
}

// finish ends the transaction: the statements queue adds (the last of
// which writes the key's row, exactly one) and COMMIT, in one round trip.
// now is the clock reading at the end (the server's unless a test clock is
// set). what names the step in errors.
func (t *txn) finish(ctx context.Context, what string, queue func(b *pgx.Batch, now any)) (err error) {
	if t.done {
		return fmt.Errorf("postgres: key %v: %w", t.key, pgx.ErrTxClosed)
	}
	t.done = true
	defer t.l.abandon(ctx)
	if err := t.l.ending(t.key); err != nil {
		return err
	}
	now, err := t.s.now()
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	queue(b, now)
	b.Queue(t.s.commitSQL)
	br := t.l.send(ctx, b)
	var written, committed pgconn.CommandTag
	for range b.Len() - 1 {
		if written, err = br.Exec(); err != nil {
			break
		}
	}
	if err == nil {
		committed, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		// An error before COMMIT skipped it: abandon rolls back.
		return t.s.finishError(ctx, fmt.Errorf("postgres: %s key %v: %w", what, t.key, err))
	case committed.String() == "ROLLBACK":
		return fmt.Errorf("postgres: %s key %v: %w", what, t.key, pgx.ErrTxCommitRollback)
	case written.RowsAffected() != 1:
		return fmt.Errorf("postgres: %s key %v: its row was gone (changed through tx inside fn?); fn's effects were committed without it", what, t.key)
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
	return t.l.rollback(ctx, t.key)
}
