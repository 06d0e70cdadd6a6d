package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency"
)

// txn is a reservation held in an open transaction on its own connection.
// It holds the Store's write turn and the key's turn until it ends.
type txn struct {
	s                 *Store
	conn              *sql.Conn
	tx                *sql.Tx
	complete          *sql.Stmt
	key               idempotency.Key
	fp                string
	created, expires  int64         // expires: set by Complete
	ttl               time.Duration // the completed record's, counted from completion
	busyTimeout       int64         // the connection's own, in milliseconds, or busyUnknown
	commitBusyTimeout int64         // for the UPDATE and COMMIT: see commitWait
	ended             bool
}

// Tx returns the transaction holding the key; the caller's effect runs on it.
func (t *txn) Tx() *sql.Tx { return t.tx }

// end returns the connection to the pool (its busy timeout set back from
// cur), gives up the write turn and ends the key's turn. If resp was
// committed (header is its stored form), the callers of this Store waiting
// for the key get the committed record, decoded from its stored form as a
// lookup would decode it, in a copy of their own (the caller keeps resp).
func (t *txn) end(cur int64, committed bool, resp idempotency.Response, header []byte) {
	release(t.conn, t.busyTimeout, cur)
	<-t.s.writer
	if !committed {
		t.s.keys.Leave(t.key, nil)
		return
	}
	t.s.keys.Leave(t.key, func() (*idempotency.Record, bool) {
		rec, err := record(t.key, t.fp, int64(resp.Status), header, bytes.Clone(resp.Body), resp.Body == nil, t.created, t.expires)
		return rec, err == nil
	})
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
	header, err := t.completeAndCommit(ctx, resp, cur)
	if err != nil {
		t.end(cur, false, resp, nil)
		return err
	}
	t.end(cur, true, resp, header)
	return nil
}

// completeAndCommit runs Complete's statements with the busy timeout cur
// and returns the stored header; on an error the transaction is over.
func (t *txn) completeAndCommit(ctx context.Context, resp idempotency.Response, cur int64) ([]byte, error) {
	if cur != t.busyTimeout {
		if _, err := t.tx.ExecContext(ctx, pragmaBusyTimeout(cur)); err != nil {
			rollback(t.conn, t.tx)
			return nil, mapError(ctx, "complete: set busy_timeout", err)
		}
	}
	// The expiry: the clock at completion (SQLite's unless a test clock is
	// set) plus the TTL, as stored.
	now, err := t.s.testNow()
	if err != nil {
		rollback(t.conn, t.tx)
		return nil, err
	}
	header := idempotency.MarshalHeader(resp.Header)
	err = t.tx.StmtContext(ctx, t.complete).QueryRowContext(ctx, resp.Status, header, resp.Body, t.key.Scope, t.key.ID, now, int64(t.ttl)).Scan(&t.expires)
	if errors.Is(err, sql.ErrNoRows) {
		rollback(t.conn, t.tx)
		return nil, fmt.Errorf("sqlite: complete: the reservation of key %v is gone (no row changed)", t.key)
	}
	if err != nil {
		rollback(t.conn, t.tx)
		return nil, mapError(ctx, "complete", err)
	}
	if err := t.tx.Commit(); err != nil {
		// The driver rolls a failed COMMIT back; should it not have, the
		// connection must not return to the pool inside a transaction.
		// (database/sql reports a transaction it rolled back because ctx
		// ended as ErrTxDone: mapError adds ctx's error.)
		discard(t.conn)
		return nil, mapError(ctx, "commit", err)
	}
	return header, nil
}

// Rollback abandons the transaction and frees the key; it works with a done
// ctx.
func (t *txn) Rollback(context.Context) error {
	if t.ended {
		return errEnded
	}
	t.ended = true
	defer t.end(t.busyTimeout, false, idempotency.Response{}, nil)
	err := t.tx.Rollback()
	if err == nil || errors.Is(err, sql.ErrTxDone) {
		// ErrTxDone: database/sql already rolled back when ctx ended.
		return nil
	}
	discard(t.conn)
	return mapError(context.Background(), "rollback", err)
}
