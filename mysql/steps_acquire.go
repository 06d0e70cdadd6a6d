package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// maxAcquireTries bounds how many times one Acquire that does not wait
// starts over, when the key's row appeared, vanished or was fought over (a
// deadlock) between its look-up and its locking statement. One that waits
// starts over while its wait lasts.
const maxAcquireTries = 6

// Acquire implements [backend.Stepper], on one connection:
//
//  1. It looks the key up outside any transaction (a consistent read). A
//     completed, live key is returned; an unfinished key leased to another
//     owner until a later time is reported [idempotency.ErrInProgress] at
//     once, and so is a pending row committed without its completion.
//  2. It begins a transaction. A key with no row: it inserts the pending
//     row as [Store.Reserve] does (waiting, bounded by a.Wait, for another
//     transaction holding the key), and the phase holds a new key. A key
//     with a row: it locks the row with SELECT ... FOR UPDATE, bounded by
//     a.Wait (the row exists, so no gap is locked), and judges what it
//     reads: an expired row is taken over as a new key, an unfinished row
//     whose lease is free, ended or a.Owner's gets a.Owner's lease in the
//     transaction. Only the holder of that exclusive row lock decides, so
//     of several callers exactly one obtains a Phase; the others wait for
//     it (a.Wait) or report [idempotency.ErrInProgress].
//
// A row that appears or vanishes between the two steps, or a deadlock of
// callers waiting for the same new key, makes Acquire start over while
// a.Wait lasts. The wait bounds are those of Reserve (see [Store.Reserve]
// and the package documentation): per statement on MariaDB, on the
// session (set and restored) on MySQL, where a.Wait == 0 locks rows with
// NOWAIT and probes a new key first.
func (s *Store) Acquire(ctx context.Context, a backend.Acquisition) (backend.Phase[*sql.Tx], *backend.Record, error) {
	if err := checkAcquisition(a); err != nil {
		return nil, nil, err
	}
	now, err := s.testNow()
	if err != nil {
		return nil, nil, err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, nil, mapError(ctx, err, false, "mysql: connection for key %v", a.Key)
	}
	d, err := s.dialectOf(ctx, conn)
	if err != nil {
		release(ctx, conn, nil, "")
		return nil, nil, mapError(ctx, err, false, "mysql: server version")
	}
	ac := &acquiring{s: s, conn: conn, d: d, k: keyOf(a.Key), a: a, now: now, deadline: time.Now().Add(a.Wait), first: true}
	// On MariaDB a read before the write transaction slows the transaction
	// itself (see BenchmarkShapes): while recent first acquisitions found
	// no row (new keys, as a one-step operation always has), skip it.
	// Only once a look-up has shown the table has the columns of
	// operations: on a table not upgraded, Acquire fails before the step.
	ac.insertFirst = d == dialectMariaDB && a.Wait == 0 && s.lookup != backend.LookupAlways &&
		s.stepColumns.Load() && !s.acquireFinds.Replays()
	if d == dialectMySQL {
		if _, err := conn.ExecContext(ctx, saveAndSetLockWaitSQL(lockWaitSeconds(a.Wait))); err != nil {
			discard(conn) // the session's lock wait timeout is unknown
			return nil, nil, mapError(ctx, err, false, "mysql: set innodb_lock_wait_timeout")
		}
		ac.restore = restoreSavedLockWaitSQL
	}
	for try := 1; ; try++ {
		p, rec, err := ac.once(ctx)
		if !errors.Is(err, errAgain) {
			if p == nil {
				return nil, rec, err
			}
			return p, nil, nil
		}
		// A caller that waits keeps trying while its wait lasts: a deadlock
		// there means that the key's holder rolled back and another waiter
		// took it, which this caller then waits for.
		if ctx.Err() != nil || (a.Wait == 0 && try == maxAcquireTries) || (a.Wait > 0 && !time.Now().Before(ac.deadline)) {
			release(ctx, conn, nil, ac.restore)
			return nil, nil, mapError(ctx, fmt.Errorf("%w: %w", backend.ErrConflict, err), false, "mysql: acquire key %v", a.Key)
		}
	}
}

// checkAcquisition refuses, with [idempotency.ErrInvalidConfig], what
// Acquire cannot store or judge.
func checkAcquisition(a backend.Acquisition) error {
	if err := a.Validate(); err != nil {
		return fmt.Errorf("mysql: key %v: %w", a.Key, err)
	}
	return nil
}

// checkProgress refuses, with [idempotency.ErrInvalidConfig], a progress
// that a Phase cannot store.
func checkProgress(k idempotency.Key, progress []byte) error {
	if err := backend.CheckProgress(progress); err != nil {
		return fmt.Errorf("mysql: key %v: %w", k, err)
	}
	return nil
}

// errAgain marks an attempt of Acquire that found the key changed between
// its statements (or a deadlock): it rolled back and keeps the connection,
// and Acquire starts over.
var errAgain = errors.New("mysql: the key changed while it was acquired")

// acquiring is one call of Acquire.
type acquiring struct {
	s        *Store
	conn     *sql.Conn
	d        dialect
	k        key
	a        backend.Acquisition
	now      any       // the test clock's reading, nil for the server's
	deadline time.Time // when a.Wait runs out
	restore  string    // restores the session's lock wait timeout (MySQL)
	// first: the next attempt is the first; insertFirst: it skips the
	// look-up (see Store.acquireFinds).
	first, insertFirst bool
}

// bound is the prefix that bounds the next statement's lock wait on
// MariaDB: the rest of a.Wait, 0 once it ran out. On MySQL the session
// bounds it.
func (ac *acquiring) bound() string {
	if ac.d == dialectMySQL {
		return ""
	}
	left := time.Until(ac.deadline)
	if ac.a.Wait == 0 || left <= 0 {
		return statementWait(0)
	}
	return statementWait(left)
}

// fail ends the Acquire with err: it rolls tx back (if any) and releases
// the connection.
func (ac *acquiring) fail(ctx context.Context, tx *sql.Tx, err error) (*phase, *backend.Record, error) {
	release(ctx, ac.conn, tx, ac.restore)
	return nil, nil, err
}

// again rolls tx back, keeping the connection, for another attempt.
func (ac *acquiring) again(ctx context.Context, tx *sql.Tx, why error) (*phase, *backend.Record, error) {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return ac.fail(ctx, nil, mapError(ctx, err, false, "mysql: acquire key %v: roll back", ac.k.key))
	}
	return nil, nil, fmt.Errorf("%w (%w)", errAgain, why)
}

// once is one attempt of Acquire. It returns errAgain (connection kept,
// no transaction open) or ends the call (connection released unless a
// phase holds it).
func (ac *acquiring) once(ctx context.Context) (*phase, *backend.Record, error) {
	s, k := ac.s, ac.k
	var rw stepRow
	if ac.insertFirst {
		// Recent first acquisitions found no row: insert straight away,
		// as Reserve does under LookupNever. A row that exists fails the
		// INSERT (duplicate key), and the next attempt reads it.
		ac.insertFirst = false
	} else {
		var err error
		rw, err = scanStep(ac.conn.QueryRowContext(ctx, s.steps.readBody, k.scope, k.id), ac.now)
		if err != nil {
			return ac.fail(ctx, nil, mapError(ctx, err, false, "mysql: look up key %v", k.key))
		}
		s.stepColumns.Store(true)
		if ac.first {
			s.acquireFinds.Add(ac.a.Wait, rw.found)
			ac.first = false
		}
	}
	switch {
	case rw.completed():
		rec, err := rw.record(k.key)
		release(ctx, ac.conn, nil, ac.restore)
		return nil, rec, err
	case rw.leasedToOther(ac.a.Owner):
		return ac.fail(ctx, nil, fmt.Errorf("%w: mysql: key %v is leased to another run until %v",
			idempotency.ErrInProgress, k.key, time.Unix(0, rw.leaseEnds).UTC()))
	case rw.progress == nil && rw.held():
		return ac.fail(ctx, nil, fmt.Errorf("%w: mysql: key %v is pending in a committed row until %v",
			idempotency.ErrInProgress, k.key, time.Unix(0, rw.expires).UTC()))
	}
	if !rw.found && ac.d == dialectMySQL && ac.a.Wait == 0 {
		// No statement bound of 0 on MySQL: probe the key first.
		rec, err := s.probe(ctx, ac.conn, k, ac.now)
		if rec != nil || err != nil {
			release(ctx, ac.conn, nil, ac.restore)
			return nil, rec, err
		}
	}
	// A new key on MariaDB, on a pool of Open: START TRANSACTION travels
	// with the INSERT, and Complete's UPDATE with COMMIT, as for Reserve.
	fold := !rw.found && ac.d == dialectMariaDB && ac.restore == "" && !s.noFold && deferBegin(ac.conn)
	tx, err := ac.conn.BeginTx(ctx, &sql.TxOptions{Isolation: s.isolation})
	if err != nil {
		if fold {
			discard(ac.conn) // the deferred begin may still be pending
			return nil, nil, mapError(ctx, err, false, "mysql: begin for key %v", k.key)
		}
		return ac.fail(ctx, nil, mapError(ctx, err, false, "mysql: begin for key %v", k.key))
	}
	if !rw.found {
		return ac.insert(ctx, tx, fold)
	}
	return ac.lock(ctx, tx)
}

// insert takes a key that had no row: the pending row, as Reserve inserts
// it, in tx. fold: tx's BeginTx was deferred, and the INSERT begins it.
func (ac *acquiring) insert(ctx context.Context, tx *sql.Tx, fold bool) (*phase, *backend.Record, error) {
	s, k, a := ac.s, ac.k, ac.a
	left, ttl := ttlArgs(a.TTL)
	insert := ac.bound() + s.insertSQL
	if fold {
		insert = foldBegin(s.beginSQL, insert)
	}
	_, err := tx.ExecContext(ctx, insert, k.scope, k.id, []byte(a.Fingerprint), ac.now, ac.now, left, ttl)
	if err == nil {
		if ac.first { // inserted without a look-up: a first try that found no row
			s.acquireFinds.Add(a.Wait, false)
			ac.first = false
		}
		p, rec, err := ac.phase(ctx, tx, a.Fingerprint, nil, 0)
		if p != nil {
			p.fold = fold
		}
		return p, rec, err
	}
	if ac.d == dialectMariaDB && a.Wait == 0 && lockRefused(err) {
		// A lock on the key's row, or near it (see refusedAtOnce).
		rec, err := s.refusedAtOnce(ctx, ac.conn, tx, k, ac.now, mapError(ctx, err, true, ""))
		if err != nil {
			err = fmt.Errorf("mysql: acquire key %v: %w", k.key, err)
		}
		return nil, rec, err
	}
	switch err = mapError(ctx, err, true, ""); {
	case errors.Is(err, errDuplicate):
		return ac.again(ctx, tx, err) // committed meanwhile: judge it
	case errors.Is(err, backend.ErrConflict) && ctx.Err() == nil:
		return ac.again(ctx, tx, err) // a deadlock of waiters: the holder rolled back
	}
	return ac.fail(ctx, tx, fmt.Errorf("mysql: acquire key %v (wait bound %v): %w", k.key, a.Wait, err))
}

// lock takes a key that had a row: it locks the row and judges it.
func (ac *acquiring) lock(ctx context.Context, tx *sql.Tx) (*phase, *backend.Record, error) {
	s, k, a := ac.s, ac.k, ac.a
	q := ac.bound() + s.steps.lockRead
	if ac.d == dialectMySQL && a.Wait == 0 {
		q += " NOWAIT"
	}
	rw, err := scanStep(tx.QueryRowContext(ctx, q, k.scope, k.id), ac.now)
	if err != nil {
		if err = mapError(ctx, err, true, ""); errors.Is(err, backend.ErrConflict) && ctx.Err() == nil {
			return ac.again(ctx, tx, err)
		}
		return ac.fail(ctx, tx, fmt.Errorf("mysql: acquire key %v (wait bound %v): %w", k.key, a.Wait, err))
	}
	switch {
	case !rw.found:
		return ac.again(ctx, tx, errors.New("the row was deleted"))
	case rw.completed():
		rec, err := rw.record(k.key)
		release(ctx, ac.conn, tx, ac.restore)
		return nil, rec, err
	case !rw.live():
		// Expired: taken over as a new key, as Reserve does.
		n, err := takeOver(ctx, tx, s.takeoverSQL, k, []byte(a.Fingerprint), ac.now, a.TTL)
		if err != nil {
			return ac.fail(ctx, tx, mapError(ctx, err, false, "mysql: acquire key %v: take over", k.key))
		}
		if n != 1 {
			return ac.again(ctx, tx, errors.New("the expired row changed"))
		}
		return ac.phase(ctx, tx, a.Fingerprint, nil, 0)
	case rw.progress == nil:
		return ac.fail(ctx, tx, fmt.Errorf("%w: mysql: key %v is pending in a committed row until %v",
			idempotency.ErrInProgress, k.key, time.Unix(0, rw.expires).UTC()))
	case rw.leasedToOther(a.Owner):
		return ac.fail(ctx, tx, fmt.Errorf("%w: mysql: key %v is leased to another run until %v",
			idempotency.ErrInProgress, k.key, time.Unix(0, rw.leaseEnds).UTC()))
	}
	left, lease := ttlArgs(a.Lease)
	if _, err := tx.ExecContext(ctx, s.steps.lease, a.Owner, ac.now, left, lease, k.scope, k.id); err != nil {
		return ac.fail(ctx, tx, mapError(ctx, err, false, "mysql: acquire key %v: lease", k.key))
	}
	return ac.phase(ctx, tx, string(rw.fingerprint), rw.progress, rw.tries)
}

// phase returns the phase that holds the key in tx, after restoring the
// session's lock wait timeout (MySQL): the phase's own statements keep the
// session's.
func (ac *acquiring) phase(ctx context.Context, tx *sql.Tx, fp string, progress []byte, tries int) (*phase, *backend.Record, error) {
	if ac.restore != "" {
		if _, err := tx.ExecContext(ctx, ac.restore); err != nil {
			_ = tx.Rollback()
			discard(ac.conn)
			return nil, nil, mapError(ctx, err, false, "mysql: restore innodb_lock_wait_timeout")
		}
	}
	return &phase{s: ac.s, conn: ac.conn, tx: tx, key: ac.k, a: ac.a, fp: fp, progress: progress, tries: tries}, nil, nil
}
