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

// Reserve implements [idempotency.KeyStore].
//
// It may first look the key up with one prepared SELECT on any connection
// of the pool, outside any transaction: a completed, live key is returned
// at once. [Config.Lookup] says when: by default while replays were more
// than a fifth of the Store's recent first tries (a caller that waited for
// a held key is not counted). A fresh Store does not; its first replay
// switches the look-up on, four new keys in a row switch it off, and after
// a long run of new keys five replays in a row switch it on again. Under
// any policy the look-up also comes first when the write turn is busy, so
// a replay never waits for writers of other keys. Then Reserve takes the
// Store's write turn (SQLite has one writer at a time), then a connection,
// and begins a transaction whose first statement inserts the reservation;
// a completed key found there is returned as the look-up would have
// returned it. A reservation that cannot take the turn or the write lock
// looks the key up before it returns an error, whatever the policy.
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
// waits for the turn until r.Deadline, then gets [backend.ErrConflict].
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
//     reports [backend.ErrConflict].
//
// A key found completed after such a wait is returned instead.
//
// An unfinished operation's key (see [Store.Acquire]) is a committed
// pending row that never expires: Reserve reports it with
// [idempotency.ErrInProgress] at once, whatever r.Wait, and never takes it
// over.
func (s *Store) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*sql.Tx], *backend.Record, error) {
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
	o, rec, err := s.openKey(ctx, st, r, now, true, s.lookingFirst(), insertReservation(st, r, now))
	if o == nil {
		if rec != nil {
			s.firstTries.Add(r.Wait, true)
		}
		return nil, rec, err
	}
	if !o.won {
		rec, err := s.read(ctx, o.tx, r.Key)
		o.end()
		s.releaseTurn()
		if rec != nil {
			s.firstTries.Add(r.Wait, true)
		}
		return nil, rec, err
	}
	t, err := o.hold(ctx, s, st, r)
	if err != nil {
		s.releaseTurn()
		return nil, nil, err
	}
	s.firstTries.Add(r.Wait, false)
	return t, nil, nil
}

// lookingFirst reports whether Reserve looks the key up before it takes
// the write turn ([Config.Lookup]).
func (s *Store) lookingFirst() bool {
	switch s.policy {
	case backend.LookupAlways:
		return true
	case backend.LookupNever:
		return false
	}
	return s.firstTries.Replays()
}

// openKey takes the Store's write turn for r.Key and begins a transaction
// whose first statement is first. It is what Reserve, Acquire and Forget
// share. With lookup set, a completed live key is looked up outside any
// transaction and returned as rec when found: first, if lookFirst is set
// or the write turn is not free at once (so that a replay never waits for
// writers of other keys), and again after a failure to take the turn or
// the write lock, before any error is returned (the key's holder may have
// completed it). now is the test clock's reading (nil for SQLite's).
//
// On success (o not nil) the caller holds the write turn and o's open
// transaction: it ends both. Otherwise neither is held.
func (s *Store) openKey(ctx context.Context, st *stmts, r backend.Reservation, now any, lookup, lookFirst bool, first firstStatement) (o *opened, rec *backend.Record, err error) {
	deadline := time.Now().Add(r.Wait)
	look := func() *backend.Record {
		if !lookup {
			return nil
		}
		if rec, lerr := s.lookup(ctx, st, r, now); lerr == nil && rec != nil {
			return rec
		}
		return nil
	}
	// Without the look-up first, the turn is taken only if it is free at
	// once: a reservation that would wait behind another writer looks the
	// key up first anyway.
	turned := false
	if lookup && !lookFirst {
		turned = s.tryAcquire(&r.Key)
		lookFirst = !turned
	}
	if lookup && lookFirst {
		rec, err := s.lookup(ctx, st, r, now)
		if err != nil || rec != nil {
			return nil, rec, err
		}
	}
	by := lockBound(r, deadline)
	// err, the named result, is nil here: the turn was taken above or not yet.
	if !turned {
		err = s.acquire(ctx, &r.Key, r.NoWait, deadline, turnWait(r, by))
	}
	if err != nil {
		if errors.Is(err, idempotency.ErrInProgress) {
			// The key's holder may have committed and not yet given the
			// turn back.
			if rec := look(); rec != nil {
				return nil, rec, nil
			}
			return nil, nil, err
		}
		if errors.Is(err, backend.ErrConflict) || errors.Is(err, idempotency.ErrStore) {
			// The turn's holder may be stuck behind a writer outside the
			// Store, which may hold this key too.
			if started := s.lockWait.Load(); started != 0 && time.Since(time.Unix(0, started)) >= outsideAfter {
				if rec := look(); rec != nil {
					return nil, rec, nil
				}
				// Not wrapped: the key may be held, not a conflict to retry.
				err = fmt.Errorf("%w: sqlite: key %v may be held: the Store's writer waits for SQLite's write lock, held by another connection (%v)",
					idempotency.ErrInProgress, r.Key, err)
			}
		}
		return nil, nil, err
	}
	o, err = s.open(ctx, st, r, by, first)
	if err != nil {
		s.releaseTurn()
		if errors.Is(err, idempotency.ErrInProgress) || !lookFirst {
			// The writer outside the Store may just have completed the
			// key, or it was not looked up first.
			if rec := look(); rec != nil {
				return nil, rec, nil
			}
		}
		return nil, nil, err
	}
	return o, nil, nil
}

// outsideAfter is how long the holder of the write turn must have waited
// for SQLite's write lock for the lock to count as held outside the Store
// (a BEGIN that gets it takes microseconds).
const outsideAfter = 2 * time.Millisecond

// lockBound is when a reservation stops waiting for the Store's write turn
// and for SQLite's write lock. It is the call's r.Deadline, or the end of
// r.Wait (deadline) if that is later. It is zero when neither bounds it: a
// first try without a Deadline waits under the connection's busy timeout.
func lockBound(r backend.Reservation, deadline time.Time) time.Time {
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
func (s *Store) lookup(ctx context.Context, st *stmts, r backend.Reservation, now any) (*backend.Record, error) {
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

// opened is a transaction that open began on a connection of its own,
// whose first statement ran. Whoever has it ends tx, then calls end (or
// hands both to a txn).
type opened struct {
	conn *sql.Conn
	tx   *sql.Tx
	// won: the first statement took the key (a reservation inserted, a row
	// deleted); otherwise a row is in the way, which the caller reads.
	won bool
	// orig is the connection's own busy timeout (or busyUnknown), cur the
	// one it runs with now.
	orig, cur int64
}

// firstStatement runs the first statement of a transaction of open and
// reports whether it took the key.
type firstStatement func(ctx context.Context, tx *sql.Tx) (bool, error)

// insertReservation is the first statement of Reserve and of Acquire: it
// inserts the reservation, or takes over an expired row; a live row (or an
// unfinished one, whose expiry is MaxExpiry) is left as it is.
func insertReservation(st *stmts, r backend.Reservation, now any) firstStatement {
	return func(ctx context.Context, tx *sql.Tx) (bool, error) {
		// No row changed: a live row is in the way.
		return changedOne(tx.StmtContext(ctx, st.reserve).ExecContext(ctx, r.Key.Scope, r.Key.ID, r.Fingerprint, now, int64(r.TTL)))
	}
}

// changedOne reports whether the statement whose result is res changed a
// row (the statements it is used with change at most one: they name one
// key of the primary key). For an upsert SQLite counts the row inserted or
// updated; a DO UPDATE whose WHERE is false changes none.
func changedOne(res sql.Result, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	return n > 0, nil
}

// end rolls o's transaction back (if it is still open) and returns its
// connection to the pool, its busy timeout set back.
func (o *opened) end() {
	rollback(o.conn, o.tx)
	release(o.conn, o.orig, o.cur)
}

// hold makes the transaction o opened for r a reservation: the busy
// timeout is set back before the caller's statements run. On an error o
// is ended.
func (o *opened) hold(ctx context.Context, s *Store, st *stmts, r backend.Reservation) (*txn, error) {
	if o.cur != o.orig {
		// The wait bound must not apply to the caller's statements.
		if _, err := o.tx.ExecContext(ctx, pragmaBusyTimeout(o.orig)); err != nil {
			o.end()
			return nil, mapError(ctx, "reserve: restore busy_timeout", err)
		}
	}
	commit := o.orig
	if !st.wal {
		commit = max(o.orig, commitWait)
	}
	return &txn{
		s: s, conn: o.conn, tx: o.tx, complete: st.complete,
		key: r.Key, fp: r.Fingerprint, ttl: r.TTL,
		busyTimeout: o.orig, commitBusyTimeout: commit,
	}, nil
}

// open takes a connection and begins a transaction on it whose first
// statement is first (for Reserve, the reservation). Unless it returns o,
// the connection is back in the pool when it returns.
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
func (s *Store) open(ctx context.Context, st *stmts, r backend.Reservation, by time.Time, first firstStatement) (*opened, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, mapError(ctx, "reserve: connection", err)
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
			return nil, mapError(ctx, "reserve: busy_timeout", err)
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
						return nil, mapError(ctx, "reserve: busy_timeout", err)
					}
					continue
				}
				cur = wait
				if _, err := conn.ExecContext(ctx, pragmaBusyTimeout(cur)); err != nil {
					release(conn, orig, cur)
					return nil, mapError(ctx, "reserve: set busy_timeout", err)
				}
			}
		}
		attempt := time.Now()
		s.lockWait.Store(attempt.UnixNano())
		tx, won, err := begin(ctx, conn, first)
		s.lockWait.Store(0)
		if err != nil {
			if again && ctx.Err() == nil && isBusy(err) && time.Since(attempt) >= time.Duration(own)*time.Millisecond {
				continue // the busy timeout ran out, the bound has not
			}
			release(conn, orig, cur)
			return nil, waitErr(ctx, err, r, by)
		}
		return &opened{conn: conn, tx: tx, won: won, orig: orig, cur: cur}, nil
	}
}

// begin begins a transaction on conn under ctx and runs first as its
// first statement. It returns the transaction and whether first took the
// key, or an error (tx is then rolled back).
//
// With _txlock=immediate the BEGIN waits for the write lock; otherwise
// first, a write, does. Either way no snapshot is read before the lock is
// taken, so the wait is the busy handler's and the row read after it is
// the latest committed one.
func begin(ctx context.Context, conn *sql.Conn, first firstStatement) (*sql.Tx, bool, error) {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return nil, false, err
	}
	won, err := first(ctx, tx)
	if err != nil {
		rollback(conn, tx)
		return nil, false, err
	}
	return tx, won, nil
}
