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

// Reserve implements [idempotency.KeyStore], on one connection:
//
//  1. It may look the key up outside any transaction, with a consistent
//     read; a completed, live key then costs that one round trip. It does
//     so while more than about a third of recent first tries were replays,
//     for a caller that waited for the key, and always with
//     [backend.LookupAlways]; never with [backend.LookupNever]. A new key
//     saves that read otherwise.
//  2. It begins the transaction fn will use and inserts the key row (or
//     takes over an expired one); on MariaDB with a pool of [Open], in one
//     statement. A key held by another open transaction makes that
//     statement wait on the primary key, bounded by r.Wait rounded up to
//     whole seconds; r.Wait == 0 does not wait.
//
// How the wait is bounded depends on the server, which Reserve asks once
// per Store: MariaDB bounds the statement itself (SET STATEMENT
// innodb_lock_wait_timeout=N FOR INSERT ...); MySQL needs the session's
// innodb_lock_wait_timeout set and restored around it (see the package
// documentation).
//
// A first try (r.Wait == 0) of a caller that waits (not r.NoWait, its
// deadline ahead) that meets a conflict reports the key as possibly held
// (see mayBeHeld), so that the caller makes its waiting try.
func (s *Store) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*sql.Tx], *backend.Record, error) {
	t, rec, err := s.reserve(ctx, r)
	return t, rec, mayBeHeld(ctx, r, err)
}

// mayBeHeld reports err, a conflict ([backend.ErrConflict]) met by the
// first try of a caller that waits (r.Wait == 0, not r.NoWait, r.Deadline
// ahead), as [idempotency.ErrInProgress]: the key may be held, and the
// caller then makes its waiting try, which waits for the holder (bounded
// by r.Deadline) or finds the key free. On a Galera cluster with streaming
// replication a key another node has just reserved gives such conflicts
// for a moment: the reservation's row reaches this node certified but not
// yet applied, and a no-wait INSERT here fails certification (1213), or is
// refused by the applier's locks while the probe that follows finds none
// (1205). Retried without waiting, ten of those in a row ended the call
// with ErrStore long before the holder answered. The conflict stays in the
// chain: a caller with no waiter slot left ([idempotency.Config].MaxWaiters)
// retries it as a conflict, as before, rather than give up with
// ErrInProgress. Any other error, and every error of a NoWait caller, of a
// waiting try or past the deadline, is returned as it is.
func mayBeHeld(ctx context.Context, r backend.Reservation, err error) error {
	if err == nil || r.Wait != 0 || r.NoWait || ctx.Err() != nil || !time.Now().Before(r.Deadline) ||
		!errors.Is(err, backend.ErrConflict) || errors.Is(err, idempotency.ErrInProgress) {
		return err
	}
	return fmt.Errorf("%w: mysql: key %v (no wait) may be held: %w", idempotency.ErrInProgress, r.Key, err)
}

func (s *Store) reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*sql.Tx], *backend.Record, error) {
	if r.TTL <= 0 {
		return nil, nil, fmt.Errorf("%w: mysql: key %v: reservation TTL %v", idempotency.ErrInvalidConfig, r.Key, r.TTL)
	}
	now, err := s.testNow()
	if err != nil {
		return nil, nil, err
	}
	k := keyOf(r.Key)
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, nil, mapError(ctx, err, false, "mysql: connection for key %v", r.Key)
	}
	d, err := s.dialectOf(ctx, conn)
	if err != nil {
		release(ctx, conn, nil, "")
		return nil, nil, mapError(ctx, err, false, "mysql: server version")
	}
	if d == dialectMySQL {
		return s.reserveSession(ctx, conn, k, r, now)
	}
	rw := row{}
	if s.lookingFirst(r) {
		rw, err = scanRow(conn.QueryRowContext(ctx, s.readSQL, k.scope, k.id), now)
		if err != nil {
			release(ctx, conn, nil, "")
			return nil, nil, mapError(ctx, err, false, "mysql: look up key %v", r.Key)
		}
		if rw.completed() {
			release(ctx, conn, nil, "")
			rec, err := rw.record(r.Key)
			if err == nil {
				s.firstTries.Add(r.Wait, true)
			}
			return nil, rec, err
		}
	}
	// On a pool of Open, START TRANSACTION travels with the INSERT.
	fold := !s.noFold && deferBegin(conn)
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: s.isolation})
	if err != nil {
		if fold {
			discard(conn) // the deferred begin may still be pending
		} else {
			release(ctx, conn, nil, "")
		}
		return nil, nil, mapError(ctx, err, false, "mysql: begin for key %v", r.Key)
	}
	begin := ""
	if fold {
		begin = s.beginSQL
	}
	won, rec, err := s.claim(ctx, tx, k, r, statementWait(r.Wait), begin, rw.found && !rw.live(), now)
	if r.Wait == 0 && lockRefused(err) {
		rec, err := s.refusedAtOnce(ctx, conn, tx, k, now, err)
		if rec != nil {
			s.firstTries.Add(r.Wait, true)
		}
		return nil, rec, err
	}
	if err != nil || !won {
		release(ctx, conn, tx, "")
		if rec != nil {
			s.firstTries.Add(r.Wait, true)
		}
		return nil, rec, mapError(ctx, err, false, "mysql: reserve key %v (wait bound %v)", r.Key, r.Wait)
	}
	s.firstTries.Add(r.Wait, false)
	return &txn{s: s, conn: conn, tx: tx, key: k, ttl: r.TTL, fold: fold}, nil, nil
}

// refusedAtOnce ends a first try (r.Wait == 0) whose reservation met a
// lock and was refused at once (err). The lock is the key's own row held
// by another reservation, or a lock near the key that has nothing to do
// with it. A purge deleting the rows next to it takes such a lock, and so
// does a locking read of an absent key that took the gap. InnoDB makes an
// INSERT wait for those too.
//
// It rolls tx back and probes the key's row without waiting. A row held
// elsewhere keeps err ([idempotency.ErrInProgress]). A row completed
// meanwhile is returned. Otherwise the refusal was a passing conflict
// ([backend.ErrConflict]), which Do retries after a short backoff,
// instead of a wait for a key nobody holds. It releases conn.
func (s *Store) refusedAtOnce(ctx context.Context, conn *sql.Conn, tx *sql.Tx, k key, now any, err error) (*backend.Record, error) {
	if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
		discard(conn)
		return nil, mapError(ctx, err, false, "mysql: reserve key %v", k.key)
	}
	rec, perr := s.probe(ctx, conn, k, now)
	release(ctx, conn, nil, "")
	switch {
	case perr != nil:
		return nil, perr
	case rec != nil:
		return rec, nil
	}
	// Not err itself in the chain: it says ErrInProgress.
	return nil, fmt.Errorf("%w: mysql: reserve key %v met a lock near the key, not on it (%v)", backend.ErrConflict, k.key, err)
}

// lookingFirst reports whether Reserve looks r's key up before reserving
// it (MariaDB). It does always with [backend.LookupAlways], never with
// [backend.LookupNever]. Otherwise it does for a caller that waited for
// the key (its holder may have completed it), and while more than about a
// third of recent first tries found a completed key (replayWeight).
func (s *Store) lookingFirst(r backend.Reservation) bool {
	switch {
	case s.lookup == backend.LookupNever:
		return false
	case s.lookup == backend.LookupAlways || r.Wait > 0:
		return true
	}
	return s.firstTries.Replays()
}

// claim takes the key in tx: it takes over the expired row the lookup saw,
// or inserts the row. When the insert meets a committed row it reads that
// row with a locking read. Unlike a consistent read, that sees the latest
// committed version under every isolation level. It then either takes the
// row over (expired) or returns it (completed). The statements that may
// wait for the key are prefixed by bound (statementWait), which is empty
// when the session bounds them. A non-empty begin (Store.beginSQL) says
// that tx's BeginTx was deferred: the first statement begins the
// transaction. now is the test clock's reading, nil for the server's clock.
func (s *Store) claim(ctx context.Context, tx *sql.Tx, k key, r backend.Reservation, bound, begin string, sawExpired bool, now any) (bool, *backend.Record, error) {
	left, ttl := ttlArgs(r.TTL)
	fp := []byte(r.Fingerprint)
	insert := bound + s.insertSQL
	if begin != "" && sawExpired {
		// The takeover's row count is needed: begin on its own.
		if _, err := tx.ExecContext(ctx, "BEGIN NOT ATOMIC "+begin+"END"); err != nil {
			return false, nil, mapError(ctx, err, false, "")
		}
	} else if begin != "" {
		insert = foldBegin(begin, insert)
	}
	if sawExpired {
		// Waits, bounded, if another caller is taking the row over.
		n, err := takeOver(ctx, tx, bound+s.takeoverSQL, k, fp, now, r.TTL)
		if err != nil {
			return false, nil, mapError(ctx, err, true, "")
		}
		if n == 1 {
			return true, nil, nil
		}
		// Taken over and completed, or purged, meanwhile: insert.
	}
	_, err := tx.ExecContext(ctx, insert, k.scope, k.id, fp, now, now, left, ttl)
	if err == nil {
		return true, nil, nil
	}
	if err = mapError(ctx, err, true, ""); !errors.Is(err, errDuplicate) {
		return false, nil, err
	}
	// The duplicate-key error left a shared lock on the committed row: it
	// cannot change until this transaction ends.
	rw, err := scanRow(tx.QueryRowContext(ctx, s.lockedReadSQL, k.scope, k.id), now)
	switch {
	case err != nil:
		return false, nil, mapError(ctx, err, false, "")
	case !rw.found:
		return false, nil, fmt.Errorf("%w: the row of key %v vanished while it was read", backend.ErrConflict, r.Key)
	case !rw.live():
		// Another reader holding a shared lock on the row makes this upgrade
		// a deadlock or a wait: both are conflicts worth a retry.
		n, err := takeOver(ctx, tx, bound+s.takeoverSQL, k, fp, now, r.TTL)
		if err != nil {
			return false, nil, mapError(ctx, err, false, "")
		}
		if n != 1 {
			return false, nil, fmt.Errorf("%w: the expired row of key %v changed while it was taken over", backend.ErrConflict, r.Key)
		}
		return true, nil, nil
	case rw.state == stateCompleted:
		rec, err := rw.record(r.Key)
		return false, rec, err
	}
	// An unfinished operation (see Store.Acquire, expiring never), or a
	// reservation whose transaction fn committed without its completion.
	return false, nil, fmt.Errorf("%w: key %v is pending in a committed row (an unfinished operation, or a reservation committed without its completion) until %v",
		idempotency.ErrInProgress, r.Key, time.Unix(0, rw.expires).UTC())
}

// takeOver resets k's expired row to a pending reservation with
// fingerprint fp, with the statement query (see Store.takeoverSQL), and
// reports how many rows it changed. The value is the same with or without
// the DSN's clientFoundRows, because expires_at always changes. now is the
// test clock's reading, nil for the server's clock.
func takeOver(ctx context.Context, tx *sql.Tx, query string, k key, fp []byte, now any, ttl time.Duration) (int64, error) {
	left, n := ttlArgs(ttl)
	res, err := tx.ExecContext(ctx, query, fp, now, now, left, n, k.scope, k.id, now)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// release ends a Reserve that holds no reservation. It rolls tx back (if
// any) and restores the lock wait timeout (if changed). It returns conn to
// the pool, or closes it when its session state is unknown.
func release(ctx context.Context, conn *sql.Conn, tx *sql.Tx, restore string) {
	if tx != nil {
		if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
			discard(conn)
			return
		}
	}
	if restore != "" {
		if ctx.Err() != nil {
			discard(conn)
			return
		}
		if _, err := conn.ExecContext(ctx, restore); err != nil {
			discard(conn)
			return
		}
	}
	_ = conn.Close()
}

// discard closes conn's driver connection instead of returning it to the
// pool.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}
