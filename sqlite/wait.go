package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// writeTurnWait is the least time a caller waits for the Store's write
// turn, which callers of other keys hold, before it reports a busy
// database. A caller that may not wait for its own key (r.Wait == 0) still
// waits this long for the others, like any writer waits for a lock.
const writeTurnWait = 5 * time.Second

// commitWait is the least busy timeout, in milliseconds, that Complete
// gives its UPDATE and COMMIT outside WAL mode. A COMMIT then waits for the
// readers of the database to finish. Failing it at once would run fn
// again. (In WAL mode a COMMIT waits for nobody.)
const commitWait = 5000

// busyUnknown stands for a connection's busy timeout that was not read
// because it is not changed.
const busyUnknown = -1

// acquire takes the Store's write turn. SQLite has one writer at a time.
// The writers of one Store queue for it here, in order. Each is woken as
// soon as the previous one is done, rather than polling the write lock on
// the busy handler's schedule. Writers outside the Store still meet at
// SQLite's lock.
//
// key is the caller's key, nil for a writer of no key (Purge). A turn held
// by a caller of key means the key is held. From keyBy on, acquire reports
// that with [idempotency.ErrInProgress]. (keyBy is the end of the
// reservation's Wait; at once when it is zero.)
//
// A turn held by callers of other keys is a busy database, never "key in
// progress". With noWait acquire reports it at once, wrapping
// [idempotency.ErrStore]. Otherwise it waits up to d (forever: no bound)
// while ctx lives, then reports [backend.ErrConflict].
func (s *Store) acquire(ctx context.Context, key *idempotency.Key, noWait bool, keyBy time.Time, d time.Duration) error {
	if s.tryAcquire(key) {
		return nil
	}
	held := func() error {
		if k := s.turnKey.Load(); key != nil && k != nil && *k == *key {
			return fmt.Errorf("%w: sqlite: key %v is held by another caller of the Store past the wait bound",
				idempotency.ErrInProgress, *key)
		}
		return nil
	}
	var byKey <-chan time.Time
	if wait := time.Until(keyBy); wait <= 0 {
		if err := held(); err != nil {
			return err
		}
	} else {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		byKey = timer.C
	}
	if noWait {
		return fmt.Errorf("%w: sqlite: the database is busy writing for other keys (one writer at a time); retry later",
			idempotency.ErrStore)
	}
	var bound <-chan time.Time
	if d != forever {
		timer := time.NewTimer(d)
		defer timer.Stop()
		bound = timer.C
	}
	for {
		select {
		case s.writer <- struct{}{}:
			s.turnKey.Store(key)
			return nil
		case <-ctx.Done():
			return fmt.Errorf("sqlite: waiting for the write turn: %w", ctx.Err())
		case <-byKey:
			if err := held(); err != nil {
				return err
			}
			byKey = nil // the turn is another key's: wait on for it
		case <-bound:
			if err := held(); err != nil {
				return err
			}
			return fmt.Errorf("%w: sqlite: the database's one writer stayed busy with other keys for %v",
				backend.ErrConflict, max(d, 0).Round(time.Millisecond))
		}
	}
}

// tryAcquire takes the Store's write turn for key if it is free, without
// waiting, and reports whether it did.
func (s *Store) tryAcquire(key *idempotency.Key) bool {
	select {
	case s.writer <- struct{}{}:
		s.turnKey.Store(key)
		return true
	default:
		return false
	}
}

// releaseTurn gives the Store's write turn back.
func (s *Store) releaseTurn() {
	s.turnKey.Store(nil)
	<-s.writer
}

// forever is the bound of a wait for the write turn that only ctx ends.
const forever = time.Duration(math.MaxInt64)

// turnWait is how long a reservation waits for the Store's write turn.
// When the call gave a Deadline, it waits up to by, the call's wait bound.
// Otherwise it waits for r.Wait or writeTurnWait, whichever is longer.
func turnWait(r backend.Reservation, by time.Time) time.Duration {
	if r.Deadline.IsZero() {
		return max(r.Wait, writeTurnWait)
	}
	return time.Until(by)
}

// waitErr reports a reservation that did not get SQLite's write lock. It
// returns the error as mapError maps it (ctx's error once ctx is done).
// The exception is a busy database ([backend.ErrConflict]) at the
// bound. The write lock is then held by a writer outside the Store. (The
// Store's own writers queue for its write turn before they reach the
// lock.) That writer may hold this very key. SQLite cannot tell without
// waiting, since a pending reservation is invisible until its commit. So
// with r.NoWait, and with the bound by run out, it is reported as
// [idempotency.ErrInProgress]. That is the answer a caller of a held key
// gets: ask again later with the same key. An SQLITE_BUSY before the bound, such as a deadlock SQLite refuses
// to wait for, stays a conflict to retry.
func waitErr(ctx context.Context, err error, r backend.Reservation, by time.Time) error {
	werr := mapError(ctx, "reserve: waiting for the write lock", err)
	if !errors.Is(werr, backend.ErrConflict) {
		return werr
	}
	switch {
	case r.NoWait:
		return fmt.Errorf("%w: sqlite: key %v may be held: the database's write lock is held by another connection, which SQLite cannot see into without waiting: %w",
			idempotency.ErrInProgress, r.Key, err)
	case !by.IsZero() && !time.Now().Add(time.Millisecond).Before(by):
		return fmt.Errorf("%w: sqlite: key %v may be held: the database's write lock stayed held by another connection until the wait bound: %w",
			idempotency.ErrInProgress, r.Key, err)
	}
	return werr
}

// waitMillis is d as a busy_timeout: whole milliseconds, rounded up.
func waitMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return int64(min(ms, math.MaxInt32))
}

func pragmaBusyTimeout(ms int64) string {
	return "PRAGMA busy_timeout = " + strconv.FormatInt(ms, 10)
}

// rollback ends tx; should that fail, conn is discarded rather than
// returned to the pool inside a transaction.
func rollback(conn *sql.Conn, tx *sql.Tx) {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		discard(conn)
	}
}

// release sets conn's busy timeout back from cur to orig and returns conn to
// the pool; should the reset fail, conn is discarded. It works with a done
// context.
func release(conn *sql.Conn, orig, cur int64) {
	if cur != orig {
		if _, err := conn.ExecContext(context.Background(), pragmaBusyTimeout(orig)); err != nil {
			discard(conn)
		}
	}
	_ = conn.Close()
}

// discard makes database/sql close conn's driver connection instead of
// pooling it.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
}
