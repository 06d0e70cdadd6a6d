package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/go-idempotency/idempotency"
)

// maxOwnerLen is the longest owner token [Store.Acquire] accepts, in bytes
// (the owner column).
const maxOwnerLen = 64

// maxAcquireTries bounds how many times one Acquire that does not wait
// starts over, when the key's row appeared, vanished or was fought over (a
// deadlock) between its look-up and its locking statement. One that waits
// starts over while its wait lasts.
const maxAcquireTries = 6

// stepSQL are the statements of multi-step operations and of the key
// administration, on one table.
type stepSQL struct {
	read, readBody string // the row with its step columns (consistent read)
	lockRead       string // read FOR UPDATE; the caller adds NOWAIT or a bound
	lease          string // takes the lease in the transaction
	save, release  string
	complete       string
	exists         string // the row, locked (the phase holds it already)
	probeShare     string // MariaDB: a shared lock, NOWAIT
	probeShareMy   string // MySQL: the same
	forgetRead     string // read FOR UPDATE NOWAIT
	forget         string
	abandoned      string
	listFirst      string // the unfinished keys of a scope, after an id
	listRest       string // the others
	stats          string
}

// stepCols are the columns of a stepRow, body or NULL in its place. Every
// read also reports the server's clock, by which the store judges the row.
func stepCols(body string) string {
	return `fingerprint, state, status, header, ` + body + `, COALESCE(LENGTH(body), 0), created_at, expires_at,
progress, progress IS NOT NULL, owner, lease_ends, tries, ` + nowSQL
}

// maxExpirySQL is [idempotency.MaxExpiry] in the table's unit.
const maxExpirySQL = "9223372036854775807"

func newStepSQL(q string) stepSQL {
	const where = ` WHERE scope = ? AND id = ?`
	return stepSQL{
		read:     `SELECT ` + stepCols("NULL") + ` FROM ` + q + where,
		readBody: `SELECT ` + stepCols("body") + ` FROM ` + q + where,
		lockRead: `SELECT ` + stepCols("body") + ` FROM ` + q + where + ` FOR UPDATE`,
		lease:    `UPDATE ` + q + ` SET owner = ?, lease_ends = ` + expirySQL + where,
		save: `UPDATE ` + q + ` SET state = 'pending', status = 0, header = NULL, body = NULL, progress = ?, owner = ?,
lease_ends = ` + expirySQL + `, tries = ?, expires_at = ` + maxExpirySQL + where,
		release: `UPDATE ` + q + ` SET state = 'pending', status = 0, header = NULL, body = NULL, progress = ?, owner = NULL,
lease_ends = ` + clockSQL + `, tries = ?, expires_at = ` + maxExpirySQL + where,
		complete: `UPDATE ` + q + ` SET state = 'completed', status = ?, header = ?, body = ?, expires_at = ` + expirySQL + `,
progress = NULL, owner = NULL, lease_ends = NULL, tries = 0` + where + ` AND state = 'pending'`,
		exists:       `SELECT 1 FROM ` + q + where + ` FOR UPDATE`,
		probeShare:   `SELECT 1 FROM ` + q + where + ` LOCK IN SHARE MODE NOWAIT`,
		probeShareMy: `SELECT 1 FROM ` + q + where + ` FOR SHARE NOWAIT`,
		forgetRead:   `SELECT ` + stepCols("NULL") + ` FROM ` + q + where + ` FOR UPDATE NOWAIT`,
		forget:       `DELETE FROM ` + q + where,
		abandoned: `SELECT scope, id, fingerprint, progress, tries, lease_ends FROM ` + q + `
WHERE lease_ends <= GREATEST(` + clockSQL + `, ?) - ? AND progress IS NOT NULL AND tries < ?
ORDER BY lease_ends, scope, id LIMIT ?`,
		listFirst: `SELECT id, ` + stepCols("NULL") + ` FROM ` + q + ` WHERE scope = ? AND id > ? AND progress IS NOT NULL ORDER BY id LIMIT ?`,
		listRest:  `SELECT id, ` + stepCols("NULL") + ` FROM ` + q + ` WHERE scope = ? AND id > ? AND progress IS NULL ORDER BY id LIMIT ?`,
		// The clock is read once, in the derived table c.
		stats: `SELECT
  COALESCE(SUM(IF(progress IS NOT NULL, lease_ends > c.now, state = 'pending' AND expires_at > c.now)), 0),
  COALESCE(SUM(progress IS NOT NULL AND NOT COALESCE(lease_ends > c.now, FALSE)), 0),
  COALESCE(SUM(progress IS NULL AND state = 'completed' AND expires_at > c.now), 0),
  COALESCE(SUM(progress IS NULL AND expires_at <= c.now), 0),
  COALESCE(SUM(progress IS NOT NULL AND tries > 0), 0),
  MIN(IF(progress IS NOT NULL, created_at, NULL)),
  COALESCE(SUM(IF(progress IS NULL AND state = 'completed' AND expires_at > c.now, LENGTH(body), 0)), 0)
FROM ` + q + ` CROSS JOIN (SELECT ` + clockSQL + ` AS now) AS c`,
	}
}

// stepRow is a key row with the columns of multi-step operations.
type stepRow struct {
	row
	bodyLen   int64
	progress  []byte // nil: not an unfinished operation
	owner     string
	leaseEnds int64
	leased    bool // lease_ends is not NULL
	tries     int
}

// scanStep scans a row of stepCols after the columns pre; see scanRow for
// tnow. No row gives a stepRow that is not found.
func scanStep(sc interface{ Scan(...any) error }, tnow any, pre ...any) (stepRow, error) {
	rw := stepRow{row: row{found: true}}
	var (
		hasProgress bool
		owner       sql.NullString
		lease       sql.NullInt64
	)
	err := sc.Scan(append(pre, &rw.fingerprint, &rw.state, &rw.status, &rw.header, &rw.body, &rw.bodyLen, &rw.created, &rw.expires,
		&rw.progress, &hasProgress, &owner, &lease, &rw.tries, &rw.now)...)
	if errors.Is(err, sql.ErrNoRows) {
		return stepRow{}, nil
	}
	if err != nil {
		return stepRow{}, err
	}
	if hasProgress && rw.progress == nil {
		rw.progress = []byte{} // saved empty, not absent
	}
	rw.owner, rw.leaseEnds, rw.leased = owner.String, lease.Int64, lease.Valid
	rw.judgeBy(tnow)
	return rw, nil
}

// leaseLive reports whether the row's lease has not ended by its clock.
func (rw stepRow) leaseLive() bool { return rw.leased && rw.leaseEnds > rw.now }

// held reports whether the committed row alone says the key is held: an
// unfinished operation under a live lease, or a pending row committed
// without its completion (fn committed the reservation's transaction) and
// not expired, which Reserve reports as in progress.
func (rw stepRow) held() bool {
	if rw.progress != nil {
		return rw.leaseLive()
	}
	return rw.live() && rw.state != stateCompleted
}

// leasedToOther reports whether the row is an unfinished operation under
// the live lease of another owner than owner.
func (rw stepRow) leasedToOther(owner string) bool {
	return rw.progress != nil && rw.leaseLive() && rw.owner != owner
}

// Acquire implements [idempotency.Stepper], on one connection:
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
func (s *Store) Acquire(ctx context.Context, a idempotency.Acquisition) (idempotency.Phase[*sql.Tx], *idempotency.Record, error) {
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
	ac := &acquiring{s: s, conn: conn, d: d, k: keyOf(a.Key), a: a, now: now, deadline: time.Now().Add(a.Wait)}
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
			return nil, nil, mapError(ctx, fmt.Errorf("%w: %w", idempotency.ErrConflict, err), false, "mysql: acquire key %v", a.Key)
		}
	}
}

// checkAcquisition refuses, with [idempotency.ErrInvalidConfig], what
// Acquire cannot store or judge.
func checkAcquisition(a idempotency.Acquisition) error {
	switch {
	case a.TTL <= 0:
		return fmt.Errorf("%w: mysql: key %v: TTL %v", idempotency.ErrInvalidConfig, a.Key, a.TTL)
	case a.Lease < time.Millisecond:
		return fmt.Errorf("%w: mysql: key %v: lease %v shorter than 1ms", idempotency.ErrInvalidConfig, a.Key, a.Lease)
	case a.Owner == "" || len(a.Owner) > maxOwnerLen:
		return fmt.Errorf("%w: mysql: key %v: owner token of %d bytes, want 1 to %d", idempotency.ErrInvalidConfig, a.Key, len(a.Owner), maxOwnerLen)
	case a.Wait < 0:
		return fmt.Errorf("%w: mysql: key %v: negative wait %v", idempotency.ErrInvalidConfig, a.Key, a.Wait)
	}
	for i := 0; i < len(a.Owner); i++ {
		if c := a.Owner[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: mysql: key %v: owner token has byte %#x, want printable ASCII", idempotency.ErrInvalidConfig, a.Key, c)
		}
	}
	return nil
}

// checkProgress refuses, with [idempotency.ErrInvalidConfig], a progress
// that a Phase cannot store.
func checkProgress(k idempotency.Key, progress []byte) error {
	switch {
	case progress == nil:
		return fmt.Errorf("%w: mysql: key %v: nil progress", idempotency.ErrInvalidConfig, k)
	case len(progress) > idempotency.MaxProgressLen:
		return fmt.Errorf("%w: mysql: key %v: progress of %d bytes, more than %d", idempotency.ErrInvalidConfig, k, len(progress), idempotency.MaxProgressLen)
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
	a        idempotency.Acquisition
	now      any       // the test clock's reading, nil for the server's
	deadline time.Time // when a.Wait runs out
	restore  string    // restores the session's lock wait timeout (MySQL)
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
func (ac *acquiring) fail(ctx context.Context, tx *sql.Tx, err error) (*phase, *idempotency.Record, error) {
	release(ctx, ac.conn, tx, ac.restore)
	return nil, nil, err
}

// again rolls tx back, keeping the connection, for another attempt.
func (ac *acquiring) again(ctx context.Context, tx *sql.Tx, why error) (*phase, *idempotency.Record, error) {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return ac.fail(ctx, nil, mapError(ctx, err, false, "mysql: acquire key %v: roll back", ac.k.key))
	}
	return nil, nil, fmt.Errorf("%w (%w)", errAgain, why)
}

// once is one attempt of Acquire. It returns errAgain (connection kept,
// no transaction open) or ends the call (connection released unless a
// phase holds it).
func (ac *acquiring) once(ctx context.Context) (*phase, *idempotency.Record, error) {
	s, k := ac.s, ac.k
	rw, err := scanStep(ac.conn.QueryRowContext(ctx, s.steps.readBody, k.scope, k.id), ac.now)
	if err != nil {
		return ac.fail(ctx, nil, mapError(ctx, err, false, "mysql: look up key %v", k.key))
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
	tx, err := ac.conn.BeginTx(ctx, &sql.TxOptions{Isolation: s.isolation})
	if err != nil {
		return ac.fail(ctx, nil, mapError(ctx, err, false, "mysql: begin for key %v", k.key))
	}
	if !rw.found {
		return ac.insert(ctx, tx)
	}
	return ac.lock(ctx, tx)
}

// insert takes a key that had no row: the pending row, as Reserve inserts
// it, in tx.
func (ac *acquiring) insert(ctx context.Context, tx *sql.Tx) (*phase, *idempotency.Record, error) {
	s, k, a := ac.s, ac.k, ac.a
	left, ttl := ttlArgs(a.TTL)
	_, err := tx.ExecContext(ctx, ac.bound()+s.insertSQL, k.scope, k.id, []byte(a.Fingerprint), ac.now, ac.now, left, ttl)
	if err == nil {
		return ac.phase(ctx, tx, a.Fingerprint, nil, 0)
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
	case errors.Is(err, idempotency.ErrConflict) && ctx.Err() == nil:
		return ac.again(ctx, tx, err) // a deadlock of waiters: the holder rolled back
	}
	return ac.fail(ctx, tx, fmt.Errorf("mysql: acquire key %v (wait bound %v): %w", k.key, a.Wait, err))
}

// lock takes a key that had a row: it locks the row and judges it.
func (ac *acquiring) lock(ctx context.Context, tx *sql.Tx) (*phase, *idempotency.Record, error) {
	s, k, a := ac.s, ac.k, ac.a
	q := ac.bound() + s.steps.lockRead
	if ac.d == dialectMySQL && a.Wait == 0 {
		q += " NOWAIT"
	}
	rw, err := scanStep(tx.QueryRowContext(ctx, q, k.scope, k.id), ac.now)
	if err != nil {
		if err = mapError(ctx, err, true, ""); errors.Is(err, idempotency.ErrConflict) && ctx.Err() == nil {
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
func (ac *acquiring) phase(ctx context.Context, tx *sql.Tx, fp string, progress []byte, tries int) (*phase, *idempotency.Record, error) {
	if ac.restore != "" {
		if _, err := tx.ExecContext(ctx, ac.restore); err != nil {
			_ = tx.Rollback()
			discard(ac.conn)
			return nil, nil, mapError(ctx, err, false, "mysql: restore innodb_lock_wait_timeout")
		}
	}
	return &phase{s: ac.s, conn: ac.conn, tx: tx, key: ac.k, a: ac.a, fp: fp, progress: progress, tries: tries}, nil, nil
}

// phase is a transaction of [Store.Acquire] on one connection.
type phase struct {
	s        *Store
	conn     *sql.Conn
	tx       *sql.Tx
	key      key
	a        idempotency.Acquisition
	fp       string
	progress []byte
	tries    int
	done     bool
}

// Tx returns the phase's transaction; the step's writes run on it.
func (p *phase) Tx() *sql.Tx { return p.tx }

// Fingerprint returns the fingerprint the operation started with.
func (p *phase) Fingerprint() string { return p.fp }

// Progress returns the progress last saved, nil for a new key.
func (p *phase) Progress() []byte { return p.progress }

// Tries returns how many runs released the key after a failure.
func (p *phase) Tries() int { return p.tries }

// Save commits the phase with progress and the owner's lease.
func (p *phase) Save(ctx context.Context, progress []byte) error {
	return p.commit(ctx, progress, false)
}

// Release commits the phase with progress, the lease ended now and one
// more try.
func (p *phase) Release(ctx context.Context, progress []byte) error {
	return p.commit(ctx, progress, true)
}

func (p *phase) commit(ctx context.Context, progress []byte, release bool) error {
	if p.done {
		return errEnded
	}
	p.done = true
	if err := checkProgress(p.key.key, progress); err != nil {
		p.end()
		return err
	}
	now, err := p.s.testNow()
	if err != nil {
		p.end()
		return err
	}
	k := p.key
	var res sql.Result
	if release {
		res, err = p.tx.ExecContext(ctx, p.s.steps.release, progress, now, p.tries+1, k.scope, k.id)
	} else {
		left, lease := ttlArgs(p.a.Lease)
		res, err = p.tx.ExecContext(ctx, p.s.steps.save, progress, p.a.Owner, now, left, lease, p.tries, k.scope, k.id)
	}
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil && n == 0 {
		// Nothing changed (the same progress and lease again, without the
		// DSN's clientFoundRows), or fn deleted the row: which?
		var one int
		if err = p.tx.QueryRowContext(ctx, p.s.steps.exists, k.scope, k.id).Scan(&one); errors.Is(err, sql.ErrNoRows) {
			err = errPendingGone
		}
	}
	if err != nil {
		p.end()
		return mapError(ctx, err, false, "mysql: save key %v", k.key)
	}
	err = p.tx.Commit()
	_ = p.conn.Close()
	return mapError(ctx, err, false, "mysql: commit key %v", k.key)
}

// Complete stores resp as the key's completed record and commits.
func (p *phase) Complete(ctx context.Context, resp idempotency.Response) error {
	if p.done {
		return errEnded
	}
	p.done = true
	now, err := p.s.testNow()
	if err != nil {
		p.end()
		return err
	}
	k := p.key
	left, ttl := ttlArgs(p.a.TTL)
	res, err := p.tx.ExecContext(ctx, p.s.steps.complete, resp.Status, idempotency.MarshalHeader(resp.Header), resp.Body, now, left, ttl, k.scope, k.id)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil && n != 1 {
		err = errPendingGone // fn deleted or completed the row through tx
	}
	if err != nil {
		p.end()
		return mapError(ctx, err, false, "mysql: complete key %v", k.key)
	}
	err = p.tx.Commit()
	_ = p.conn.Close()
	return mapError(ctx, err, false, "mysql: commit key %v", k.key)
}

// Rollback abandons the phase and releases the connection.
func (p *phase) Rollback(context.Context) error {
	if p.done {
		return nil
	}
	p.done = true
	if err := p.end(); err != nil {
		return fmt.Errorf("mysql: roll back key %v: %w", p.key.key, err)
	}
	return nil
}

// end rolls the transaction back and releases the connection (see
// txn.end).
func (p *phase) end() error {
	err := p.tx.Rollback()
	if err != nil && !errors.Is(err, sql.ErrTxDone) {
		discard(p.conn)
		return err
	}
	_ = p.conn.Close()
	return nil
}

// Abandoned implements [idempotency.Stepper] with one consistent read
// (no lock), on the index on lease_ends. q.Limit must be 1 to 1000 and
// q.Grace not negative, else the error wraps
// [idempotency.ErrInvalidConfig].
func (s *Store) Abandoned(ctx context.Context, q idempotency.AbandonedQuery) ([]idempotency.AbandonedKey, error) {
	if err := checkLimit(q.Limit); err != nil {
		return nil, err
	}
	if q.Grace < 0 {
		return nil, fmt.Errorf("%w: mysql: negative grace %v", idempotency.ErrInvalidConfig, q.Grace)
	}
	now, err := s.testNow()
	if err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, s.steps.abandoned, now, math.MinInt64+int64(q.Grace), int64(q.Grace), q.MaxTries, q.Limit)
	if err != nil {
		return nil, mapError(ctx, err, false, "mysql: abandoned keys")
	}
	defer rows.Close()
	var out []idempotency.AbandonedKey
	for rows.Next() {
		var (
			scope, id, fp, progress []byte
			ak                      idempotency.AbandonedKey
			ended                   int64
		)
		if err := rows.Scan(&scope, &id, &fp, &progress, &ak.Tries, &ended); err != nil {
			return nil, mapError(ctx, err, false, "mysql: abandoned keys")
		}
		if progress == nil {
			progress = []byte{}
		}
		ak.Key = idempotency.Key{Scope: string(scope), ID: string(id)}
		ak.Fingerprint, ak.Progress, ak.LeaseEnded = string(fp), progress, time.Unix(0, ended).UTC()
		out = append(out, ak)
	}
	if err := rows.Err(); err != nil {
		return nil, mapError(ctx, err, false, "mysql: abandoned keys")
	}
	return out, nil
}

// checkLimit refuses a page size outside 1 to 1000.
func checkLimit(n int) error {
	if n < 1 || n > 1000 {
		return fmt.Errorf("%w: mysql: limit %d, want 1 to 1000", idempotency.ErrInvalidConfig, n)
	}
	return nil
}
