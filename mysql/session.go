package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// reserveSession is Reserve on MySQL, which bounds lock waits only by the
// session's innodb_lock_wait_timeout (at least 1 second):
//
//  1. Unless [backend.LookupNever], the lookup also reads the session's
//     innodb_lock_wait_timeout.
//  2. r.Wait == 0: the row is probed with FOR UPDATE NOWAIT, and a held
//     key is reported at once.
//  3. The session's innodb_lock_wait_timeout is set to the wait bound
//     before START TRANSACTION (unless it has that value already) and
//     restored before fn runs.
func (s *Store) reserveSession(ctx context.Context, conn *sql.Conn, k key, r backend.Reservation, now any) (backend.Txn[*sql.Tx], *backend.Record, error) {
	// lockWait is the session's innodb_lock_wait_timeout when the lookup
	// read it, else -1.
	lockWait, rw := int64(-1), row{}
	if s.lookup != backend.LookupNever {
		var err error
		lockWait, rw, err = s.lookupWithLockWait(ctx, conn, k, now)
		if err != nil {
			release(ctx, conn, nil, "")
			return nil, nil, mapError(ctx, err, false, "mysql: look up key %v", r.Key)
		}
		if rw.completed() {
			release(ctx, conn, nil, "")
			rec, err := rw.record(r.Key)
			return nil, rec, err
		}
	}
	if r.Wait == 0 {
		if rec, err := s.probe(ctx, conn, k, now); rec != nil || err != nil {
			release(ctx, conn, nil, "")
			return nil, rec, err
		}
	}

	restore := ""
	if want := lockWaitSeconds(r.Wait); lockWait != want {
		set, undo := setLockWaitSQL(want), setLockWaitSQL(lockWait)
		if lockWait < 0 { // not read: save it in the session
			set, undo = saveAndSetLockWaitSQL(want), restoreSavedLockWaitSQL
		}
		if _, err := conn.ExecContext(ctx, set); err != nil {
			release(ctx, conn, nil, "")
			return nil, nil, mapError(ctx, err, false, "mysql: set innodb_lock_wait_timeout")
		}
		restore = undo
	}
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: s.isolation})
	if err != nil {
		release(ctx, conn, nil, restore)
		return nil, nil, mapError(ctx, err, false, "mysql: begin for key %v", r.Key)
	}
	won, rec, err := s.claim(ctx, tx, k, r, "", "", rw.found && !rw.live(), now)
	if err != nil || !won {
		release(ctx, conn, tx, restore)
		return nil, rec, mapError(ctx, err, false, "mysql: reserve key %v (wait bound %v)", r.Key, r.Wait)
	}
	if restore != "" {
		// fn's statements keep the session's own lock wait timeout.
		if _, err := tx.ExecContext(ctx, restore); err != nil {
			_ = tx.Rollback()
			discard(conn)
			return nil, nil, mapError(ctx, err, false, "mysql: restore innodb_lock_wait_timeout")
		}
	}
	return &txn{s: s, conn: conn, tx: tx, key: k, ttl: r.TTL}, nil, nil
}

// probe serves r.Wait == 0 on MySQL. It tells whether an open transaction
// holds the row, with a locking read that refuses to wait, in autocommit
// mode (its lock ends with the statement). A held row is read again, because a
// reader of a key completed just now may hold it for a moment: that key is
// returned, any other gives ErrInProgress. (nil, nil) means not held.
func (s *Store) probe(ctx context.Context, conn *sql.Conn, k key, now any) (*backend.Record, error) {
	var state string
	err := conn.QueryRowContext(ctx, s.probeSQL, k.scope, k.id).Scan(&state)
	if err == nil || errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err = mapError(ctx, err, true, ""); !errors.Is(err, idempotency.ErrInProgress) {
		return nil, mapError(ctx, err, false, "mysql: probe key %v", k.key)
	}
	rw, rerr := scanRow(conn.QueryRowContext(ctx, s.readSQL, k.scope, k.id), now)
	if rerr != nil {
		return nil, mapError(ctx, rerr, false, "mysql: look up key %v", k.key)
	}
	if rw.completed() {
		return rw.record(k.key)
	}
	return nil, fmt.Errorf("mysql: key %v (no wait): %w", k.key, err)
}

// lookupWithLockWait reads the key's row outside any transaction, with a
// consistent read that also reads the session's innodb_lock_wait_timeout,
// which reserveSession changes and restores.
func (s *Store) lookupWithLockWait(ctx context.Context, conn *sql.Conn, k key, now any) (int64, row, error) {
	var (
		lockWait int64
		rw       row
		state    sql.NullString
		status   sql.NullInt64
		created  sql.NullInt64
		expires  sql.NullInt64
	)
	err := conn.QueryRowContext(ctx, s.lookupVarSQL, k.scope, k.id).Scan(
		&lockWait, &rw.fingerprint, &state, &status, &rw.header, &rw.body, &created, &expires, &rw.now)
	if err != nil {
		return 0, row{}, err
	}
	rw.found = expires.Valid
	rw.state, rw.status, rw.created, rw.expires = state.String, int(status.Int64), created.Int64, expires.Int64
	rw.judgeBy(now)
	return lockWait, rw, nil
}
