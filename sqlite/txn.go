package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// txn is a reservation held in an open transaction on its own connection.
// It holds the Store's write turn until it ends.
type txn struct {
	s                 *Store
	conn              *sql.Conn
	tx                *sql.Tx
	complete          *sql.Stmt
	key               idempotency.Key
	fp                string
	ttl               time.Duration // the completed record's, counted from completion
	busyTimeout       int64         // the connection's own, in milliseconds, or busyUnknown
	commitBusyTimeout int64         // for the UPDATE and COMMIT: see commitWait
	ended             bool
}

// Tx returns the transaction holding the key; the caller's effect runs on it.
func (t *txn) Tx() *sql.Tx { return t.tx }

// end returns the connection to the pool (its busy timeout set back from
// cur) and gives up the write turn.
func (t *txn) end(cur int64) {
	release(t.conn, t.busyTimeout, cur)
	t.s.releaseTurn()
}

// Complete stores resp on the key, marks it completed and commits. Outside
// WAL mode, when the connection's busy timeout is below 5s (a DSN without
// busy_timeout), it is raised to 5s for the UPDATE and the COMMIT and
// restored afterwards. An error returned once ctx is done has ctx.Err() in
// its chain, and then nothing was committed.
func (t *txn) Complete(ctx context.Context, resp idempotency.Response) error {
	if t.ended {
		return errEnded
	}
	t.ended = true
	cur := t.commitBusyTimeout
	err := t.completeAndCommit(ctx, resp, cur)
	t.end(cur)
	return err
}

// completeAndCommit runs Complete's statements with the busy timeout cur;
// on an error the transaction is over.
func (t *txn) completeAndCommit(ctx context.Context, resp idempotency.Response, cur int64) error {
	return t.commitWith(ctx, cur, func(now any) error {
		header := backend.MarshalHeader(resp.Header)
		changed, err := changedOne(t.tx.StmtContext(ctx, t.complete).ExecContext(ctx, resp.Status, header, resp.Body, t.key.Scope, t.key.ID, now, int64(t.ttl)))
		if err != nil {
			return mapError(ctx, "complete", err)
		}
		if !changed {
			return fmt.Errorf("sqlite: complete: the reservation of key %v is gone (no row changed)", t.key)
		}
		return nil
	})
}

// commitWith runs write, the last statement of the transaction, with the
// busy timeout cur and the clock now (the test clock's reading, nil for
// SQLite's), then commits. write returns its errors mapped. On an error
// the transaction is over.
func (t *txn) commitWith(ctx context.Context, cur int64, write func(now any) error) error {
	if cur != t.busyTimeout {
		if _, err := t.tx.ExecContext(ctx, pragmaBusyTimeout(cur)); err != nil {
			rollback(t.conn, t.tx)
			return mapError(ctx, "complete: set busy_timeout", err)
		}
	}
	// The clock at completion: SQLite's unless a test clock is set.
	now, err := t.s.testNow()
	if err != nil {
		rollback(t.conn, t.tx)
		return err
	}
	if err := write(now); err != nil {
		rollback(t.conn, t.tx)
		return err
	}
	if err := t.tx.Commit(); err != nil {
		// The driver rolls a failed COMMIT back; should it not have, the
		// connection must not return to the pool inside a transaction.
		// (database/sql reports a transaction it rolled back because ctx
		// ended as ErrTxDone: mapError adds ctx's error.)
		discard(t.conn)
		return mapError(ctx, "commit", err)
	}
	return nil
}

// Rollback abandons the transaction and frees the key; it works with a done
// ctx.
func (t *txn) Rollback(context.Context) error {
	if t.ended {
		return errEnded
	}
	t.ended = true
	defer t.end(t.busyTimeout)
	err := t.tx.Rollback()
	if err == nil || errors.Is(err, sql.ErrTxDone) {
		// ErrTxDone: database/sql already rolled back when ctx ended.
		return nil
	}
	discard(t.conn)
	return mapError(context.Background(), "rollback", err)
}
