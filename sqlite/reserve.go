package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency"
)

// Reserve implements [idempotency.KeyStore].
//
// It first looks the key up with one prepared SELECT on any connection of
// the pool, outside any transaction: a completed, live key is returned at
// once. Otherwise it takes the Store's write turn (SQLite has one writer at
// a time), then a connection, and begins a transaction whose first
// statement inserts the reservation.
//
// Callers of one key in one Store meet at the write turn, as any two
// writers do. (A [idempotency.Guard] lets only one of its callers of a key
// reach the Store.) The turn's holder may hold the caller's key. The caller
// then waits for the turn up to r.Wait, and looks the key up again. It gets
// the record if it is completed, else an error wrapping
// [idempotency.ErrInProgress]. A caller that gets the turn after the key's
// holder is done finds the key's row and returns the record.
//
// A caller of another key may hold the write turn. A caller with r.NoWait
// then gets an error wrapping [idempotency.ErrStore] at once. (The database
// is busy, the key is not held; retrying later is safe.) Any other caller
// waits for the turn until r.Deadline, then gets [idempotency.ErrConflict].
// Without a Deadline it waits for r.Wait or 5s, whichever is longer.
//
// Writers outside the Store (another Store, another process, plain
// transactions on db) meet it at SQLite's write lock. They may hold the key
// itself: their reservation is invisible until it commits.
//
//   - With r.Wait > 0 or r.Deadline set, the reservation waits for that
//     lock while ctx lives, up to the later of the two bounds, whatever the
//     busy timeout. Then it reports [idempotency.ErrInProgress] (the key may
//     be held).
//   - With r.NoWait it does not wait, and reports ErrInProgress.
//   - With neither it waits under the connection's own busy timeout, then
//     reports [idempotency.ErrConflict].
//
// A key found completed after such a wait is returned instead.
func (s *Store) Reserve(ctx context.Context, r idempotency.Reservation) (idempotency.Txn[*sql.Tx], *idempotency.Record, error) {
	if r.TTL <= 0 {
		return nil, nil, fmt.Errorf("%w: sqlite: key %v: reservation TTL %v", idempotency.ErrInvalidConfig, r.Key, r.TTL)
	}
	now, err := s.testNow()
	if err != nil {
		return nil, nil, err
	}
	st, err := s.statements(ctx)
	if err != nil {
		return nil, nil, err
	}
	deadline := time.Now().Add(r.Wait)
	rec, err := s.lookup(ctx, st, r, now)
	if err != nil || rec != nil {
		return nil, rec, err
	}
	by := lockBound(r, deadline)
	if err := s.acquire(ctx, &r.Key, r.NoWait, deadline, turnWait(r, by)); err != nil {
		if errors.Is(err, idempotency.ErrInProgress) {
			// The key's holder may have committed and not yet given the
			// turn back.
			if rec, lerr := s.lookup(ctx, st, r, now); lerr == nil && rec != nil {
				return nil, rec, nil
			}
			return nil, nil, err
		}
		if errors.Is(err, idempotency.ErrConflict) || errors.Is(err, idempotency.ErrStore) {
			// The turn's holder may be stuck behind a writer outside the
			// Store, which may hold this key too.
			if started := s.lockWait.Load(); started != 0 && time.Since(time.Unix(0, started)) >= outsideAfter {
				if rec, lerr := s.lookup(ctx, st, r, now); lerr == nil && rec != nil {
					return nil, rec, nil
				}
				// Not wrapped: the key may be held, not a conflict to retry.
				err = fmt.Errorf("%w: sqlite: key %v may be held: the Store's writer waits for SQLite's write lock, held by another connection (%v)",
					idempotency.ErrInProgress, r.Key, err)
			}
		}
		return nil, nil, err
	}
	t, rec, err := s.reserve(ctx, st, r, now, by)
	if t == nil && errors.Is(err, idempotency.ErrInProgress) {
		// The writer outside the Store may just have completed the key.
		if found, lerr := s.lookup(ctx, st, r, now); lerr == nil && found != nil {
			rec, err = found, nil
		}
	}
	if t == nil {
		s.releaseTurn()
		return nil, rec, err
	}
	return t, nil, nil
}

// outsideAfter is how long the holder of the write turn must have waited
// for SQLite's write lock for the lock to count as held outside the Store
// (a BEGIN that gets it takes microseconds).
const outsideAfter = 2 * time.Millisecond

// lockBound is when a reservation stops waiting for the Store's write turn
// and for SQLite's write lock. It is the call's r.Deadline, or the end of
// r.Wait (deadline) if that is later. It is zero when neither bounds it: a
// first try without a Deadline waits under the connection's busy timeout.
func lockBound(r idempotency.Reservation, deadline time.Time) time.Time {
	by := r.Deadline
	if r.Wait > 0 && deadline.After(by) {
		by = deadline
	}
	return by
}

// lookup returns the key if it is completed and live. A lookup that finds
// the database busy (a database not in WAL mode, during a commit) is
// skipped: the reservation then waits for the lock properly. now is the
// test clock's reading, nil for SQLite's clock.
func (s *Store) lookup(ctx context.Context, st *stmts, r idempotency.Reservation, now any) (*idempotency.Record, error) {
	var (
		fp               string
		status           int64
		header, body     []byte
		bodyNull         bool
		created, expires int64
	)
	err := st.lookup.QueryRowContext(ctx, r.Key.Scope, r.Key.ID, now).
		Scan(&fp, &status, &header, &body, &bodyNull, &created, &expires)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		if ctx.Err() == nil && isBusy(err) {
			return nil, nil
		}
		return nil, mapError(ctx, "reserve: lookup", err)
	}
	return record(r.Key, fp, status, header, body, bodyNull, created, expires)
}

// reserve takes a connection and inserts the reservation in a new
// transaction on it. Unless it returns a txn, the connection is back in
// the pool when it returns.
//
// The wait for SQLite's write lock is its busy handler's, under the
// connection's busy timeout. With no bound (by zero, not r.NoWait) that
// busy timeout is the bound, and on a database in WAL mode it is not even
// read. Otherwise it is read first, since database/sql may hand out any
// connection of the pool.
//
// A first try (r.Wait == 0) is the exception. It assumes the busy timeout
// read when the statements were prepared, and reads the connection's own
// only when it must lower it. As long as what remains of the bound is at
// least that busy timeout, an attempt cannot overrun the bound, and nothing
// is changed. After a SQLITE_BUSY that took the whole busy timeout, BEGIN
// is tried again.
//
// The last attempt (the bound shorter than the busy timeout, r.NoWait, or
// a connection without busy timeout) runs with the busy
// timeout set to what remains of the bound, set back before the caller's
// statements run. (A bound by a cancellable context instead would change
// nothing on the connection, but modernc.org/sqlite then watches the
// context with a goroutine and a progress handler in every statement of
// the transaction.)
func (s *Store) reserve(ctx context.Context, st *stmts, r idempotency.Reservation, now any, by time.Time) (*txn, *idempotency.Record, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, nil, mapError(ctx, "reserve: connection", err)
	}
	bounded := !by.IsZero() || r.NoWait
	// A first try (r.Wait == 0, bounded by the call's Deadline) assumes the
	// busy timeout read when the statements were prepared. It reads the
	// connection's own only when it has to lower it. So a new key under a
	// bound longer than the busy timeout costs no PRAGMA.
	firstTry := r.Wait == 0 && !r.NoWait
	orig := int64(busyUnknown)
	read := func() error { return conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&orig) }
	if !st.wal || bounded && !firstTry {
		if err := read(); err != nil {
			_ = conn.Close()
			return nil, nil, mapError(ctx, "reserve: busy_timeout", err)
		}
	}
	for {
		own := orig // the busy timeout the attempt runs with, unless lowered
		if own == busyUnknown {
			own = st.busy
		}
		cur := orig
		// again: the attempt cannot overrun the bound with the
		// connection's own busy timeout.
		again := false
		if bounded {
			var wait int64
			if !r.NoWait {
				wait = waitMillis(time.Until(by))
			}
			again = own > 0 && wait >= own
			if !again && wait != own {
				if orig == busyUnknown {
					if err := read(); err != nil {
						_ = conn.Close()
						return nil, nil, mapError(ctx, "reserve: busy_timeout", err)
					}
					continue
				}
				cur = wait
				if _, err := conn.ExecContext(ctx, pragmaBusyTimeout(cur)); err != nil {
					release(conn, orig, cur)
					return nil, nil, mapError(ctx, "reserve: set busy_timeout", err)
				}
			}
		}
		attempt := time.Now()
		s.lockWait.Store(attempt.UnixNano())
		tx, won, err := s.begin(ctx, conn, st, r, now)
		s.lockWait.Store(0)
		if err != nil {
			if again && ctx.Err() == nil && isBusy(err) && time.Since(attempt) >= time.Duration(own)*time.Millisecond {
				continue // the busy timeout ran out, the bound has not
			}
			release(conn, orig, cur)
			return nil, nil, waitErr(ctx, err, r, by)
		}
		if !won {
			rec, err := s.readLive(ctx, conn, tx, r.Key)
			release(conn, orig, cur)
			return nil, rec, err
		}
		if cur != orig {
			// The wait bound must not apply to the caller's statements.
			if _, err := tx.ExecContext(ctx, pragmaBusyTimeout(orig)); err != nil {
				rollback(conn, tx)
				release(conn, orig, cur)
				return nil, nil, mapError(ctx, "reserve: restore busy_timeout", err)
			}
		}
		commit := orig
		if !st.wal {
			commit = max(orig, commitWait)
		}
		return &txn{
			s: s, conn: conn, tx: tx, complete: st.complete,
			key: r.Key, fp: r.Fingerprint, ttl: r.TTL,
			busyTimeout: orig, commitBusyTimeout: commit,
		}, nil, nil
	}
}

// begin begins a transaction on conn under ctx and inserts the
// reservation as its first statement. It returns the transaction and
// whether the key is now held (if not, a live row exists: the caller reads
// it and ends tx), or an error (tx is then rolled back).
//
// With _txlock=immediate the BEGIN waits for the write lock; otherwise the
// INSERT does. Either way no snapshot is read before the lock is taken, so
// the wait is the busy handler's and the row read after it is the latest
// committed one.
func (s *Store) begin(ctx context.Context, conn *sql.Conn, st *stmts, r idempotency.Reservation, now any) (*sql.Tx, bool, error) {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return nil, false, err
	}
	var created int64
	err = tx.StmtContext(ctx, st.reserve).QueryRowContext(ctx, r.Key.Scope, r.Key.ID, r.Fingerprint, now, int64(r.TTL)).Scan(&created)
	if errors.Is(err, sql.ErrNoRows) {
		return tx, false, nil // a live row is in the way
	}
	if err != nil {
		rollback(conn, tx)
		return nil, false, err
	}
	return tx, true, nil
}

// readLive reads the live row that another caller committed (the write
// lock is held, so this is the latest commit) and ends tx.
func (s *Store) readLive(ctx context.Context, conn *sql.Conn, tx *sql.Tx, key idempotency.Key) (*idempotency.Record, error) {
	rec, err := s.read(ctx, tx, key)
	rollback(conn, tx)
	return rec, err
}
