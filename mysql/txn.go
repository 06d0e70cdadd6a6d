package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// txn is a reservation held by an open transaction on one connection.
type txn struct {
	s    *Store
	conn *sql.Conn
	tx   *sql.Tx
	key  key
	ttl  time.Duration // the completed record's, counted from completion
	done bool
	// fold: the transaction's BeginTx was deferred (see foldConn), so
	// Complete can store the response and commit in one statement.
	fold bool
}

var errEnded = errors.New("mysql: the reservation's transaction has already ended")

// Tx returns the transaction that holds the key; fn runs its effect on it.
func (t *txn) Tx() *sql.Tx { return t.tx }

// Complete stores resp on the key's row, marks it completed and commits.
func (t *txn) Complete(ctx context.Context, resp idempotency.Response) error {
	if t.done {
		return errEnded
	}
	t.done = true
	// The expiry: the clock at completion (the server's unless a test
	// clock is set) plus the TTL.
	now, err := t.s.testNow()
	if err != nil {
		t.end()
		return err
	}
	return completeRow(ctx, t.conn, t.tx, t.end, t.key, t.fold, t.s.completeSQL, t.s.completeFoldSQL, resp, now, t.ttl)
}

// completeRow stores resp on k's row in tx with update, whose parameters
// are the status, the header, the body, the clock now, the TTL's two
// arguments (ttlArgs), scope and id, then commits and releases conn. With
// fold (tx's BeginTx was deferred, see foldConn), folded, the same update
// with its check and COMMIT (foldCommit), does both in one statement,
// unless the arguments are too large to interpolate. On an error it rolls
// tx back with end. A row that update does not change (fn deleted or
// completed it through tx) commits nothing and gives errPendingGone. It
// is the Complete of a reservation and of a phase.
func completeRow(ctx context.Context, conn *sql.Conn, tx *sql.Tx, end func() error, k key, fold bool,
	update, folded string, resp idempotency.Response, now any, ttl time.Duration) error {
	left, ttlArg := ttlArgs(ttl)
	header := backend.MarshalHeader(resp.Header) // nil: NULL
	if fold {
		args := []driver.NamedValue{
			{Ordinal: 1, Value: int64(resp.Status)}, {Ordinal: 2, Value: header}, {Ordinal: 3, Value: resp.Body},
			{Ordinal: 4, Value: now}, {Ordinal: 5, Value: left}, {Ordinal: 6, Value: ttlArg},
			{Ordinal: 7, Value: k.scope}, {Ordinal: 8, Value: k.id},
		}
		err := execCommitting(ctx, conn, folded, args)
		if !errors.Is(err, driver.ErrSkip) {
			return endFolded(ctx, conn, tx, end, k, err)
		}
		// Too large to interpolate: UPDATE, then COMMIT.
	}
	res, err := tx.ExecContext(ctx, update, resp.Status, header, resp.Body, now, left, ttlArg, k.scope, k.id)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil {
		_ = end()
		return mapError(ctx, err, false, "mysql: complete key %v", k.key)
	}
	if n != 1 {
		// fn deleted or completed the row through tx: nothing is committed.
		_ = end()
		return fmt.Errorf("mysql: complete key %v: %w", k.key, errPendingGone)
	}
	err = tx.Commit()
	_ = conn.Close()
	return mapError(ctx, err, false, "mysql: commit key %v", k.key)
}

// endFolded ends a Complete whose folded UPDATE and COMMIT (on conn, in
// tx, for the key k) returned err: it releases the connection, or rolls
// tx back with end; an UPDATE that changed no row (fn deleted or completed
// it through tx) committed nothing and says errPendingGone.
func endFolded(ctx context.Context, conn *sql.Conn, tx *sql.Tx, end func() error, k key, err error) error {
	if err == nil {
		err = tx.Commit() // sends nothing: committed already
		_ = conn.Close()
		return mapError(ctx, err, false, "mysql: commit key %v", k.key)
	}
	_ = end()
	if err = mapError(ctx, err, false, ""); errors.Is(err, errPendingGone) {
		return fmt.Errorf("mysql: complete key %v: %w", k.key, errPendingGone)
	}
	return fmt.Errorf("mysql: complete and commit key %v: %w", k.key, err)
}

// Rollback abandons the transaction and releases the connection. A
// transaction that database/sql already rolled back (its context ended) is
// not an error.
func (t *txn) Rollback(context.Context) error {
	if t.done {
		return nil
	}
	t.done = true
	if err := t.end(); err != nil {
		return fmt.Errorf("mysql: roll back key %v: %w", t.key.key, err)
	}
	return nil
}

// end rolls the transaction back and releases the connection, closing it
// when the rollback failed (the server then ends the transaction itself).
func (t *txn) end() error {
	err := t.tx.Rollback()
	if err != nil && !errors.Is(err, sql.ErrTxDone) {
		discard(t.conn)
		return err
	}
	_ = t.conn.Close()
	return nil
}
