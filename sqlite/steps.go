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

// maxExpirySQL is [backend.MaxExpiry] in Unix nanoseconds: the expiry of
// an unfinished row.
const maxExpirySQL = "9223372036854775807"

// stepQueries are the statements of multi-step operations and of key
// administration. They need the columns that [Store.Migrate] adds to a
// v0.1.0 table (progress, owner, lease_ends, tries), so they are not
// prepared with those of Reserve: they run as plain statements.
type stepQueries struct {
	claim, save, release, complete, abandoned string
	inspect, inspectBody, forget, list, stats string
}

// infoCols are the columns a KeyInfo is built from (see keyRow.scan), the
// body only if body is set, and the clock in parameter ?now (see nowSQL).
// Without the body, only its length and whether it is NULL are read, which
// SQLite answers without loading it.
func infoCols(body bool, now int) string {
	b := "NULL"
	if body {
		b = "body"
	}
	return `scope, id, fingerprint, state, status, header, ` + b + `, body IS NULL, coalesce(length(body), 0), created_at, expires_at,
	progress, progress IS NULL, tries, lease_ends, ` + nowSQL(now)
}

// heldSQL is true for a row that is held, judged by the clock now: an
// unfinished row whose lease is live, or a pending row with no progress
// (committed by a writer outside this package) that has not expired.
func heldSQL(now string) string {
	return `(CASE WHEN progress IS NOT NULL THEN coalesce(lease_ends > ` + now + `, 0) ELSE state = 'pending' AND expires_at > ` + now + ` END)`
}

func newStepQueries(t string) stepQueries {
	return stepQueries{
		// Takes the lease of an unfinished key that is free, ended or the
		// owner's own, in the phase's transaction (which holds the write
		// lock: a compare-and-swap).
		claim: `UPDATE ` + t + ` SET owner = ?3, lease_ends = ` + expirySQL(nowSQL(4), 5) + `
WHERE scope = ?1 AND id = ?2 AND progress IS NOT NULL AND (owner IS NULL OR owner = ?3 OR coalesce(lease_ends <= ` + nowSQL(4) + `, 1))
RETURNING fingerprint, progress, tries`,
		save: `UPDATE ` + t + ` SET state = 'pending', progress = ?1, owner = ?5, lease_ends = ` + expirySQL(nowSQL(4), 6) + `, expires_at = ` + maxExpirySQL + `
WHERE scope = ?2 AND id = ?3`,
		release: `UPDATE ` + t + ` SET state = 'pending', progress = ?1, owner = NULL, lease_ends = ` + nowSQL(4) + `, tries = tries + 1, expires_at = ` + maxExpirySQL + `
WHERE scope = ?2 AND id = ?3`,
		// The parameters of the Store's complete statement.
		complete: `UPDATE ` + t + ` SET state = 'completed', status = ?1, header = ?2, body = ?3, expires_at = ` + expirySQL(nowSQL(6), 7) + `,
	progress = NULL, owner = NULL, lease_ends = NULL, tries = 0
WHERE scope = ?4 AND id = ?5 AND state = 'pending'`,
		// now - grace, clamped so as not to leave int64.
		abandoned: `SELECT scope, id, fingerprint, progress, tries, lease_ends FROM ` + t + `
WHERE progress IS NOT NULL AND lease_ends <= max(` + nowSQL(1) + `, ?2 + (-9223372036854775807 - 1)) - ?2 AND tries < ?3
ORDER BY lease_ends LIMIT ?4`,
		inspect:     `SELECT ` + infoCols(false, 3) + ` FROM ` + t + ` WHERE scope = ?1 AND id = ?2`,
		inspectBody: `SELECT ` + infoCols(true, 3) + ` FROM ` + t + ` WHERE scope = ?1 AND id = ?2`,
		forget: `DELETE FROM ` + t + ` WHERE scope = ?1 AND id = ?2 AND NOT ` + heldSQL(nowSQL(3)) + `
RETURNING ` + infoCols(false, 3),
		// The unfinished keys after ?2 (none when it is NULL), then the
		// others after ?3, each by id: ?4 is the page's size plus one.
		list: `SELECT * FROM (SELECT 0 AS part, ` + infoCols(false, 5) + ` FROM ` + t + `
	WHERE scope = ?1 AND progress IS NOT NULL AND id > ?2 ORDER BY id LIMIT ?4)
UNION ALL
SELECT * FROM (SELECT 1 AS part, ` + infoCols(false, 5) + ` FROM ` + t + `
	WHERE scope = ?1 AND progress IS NULL AND id > ?3 ORDER BY id LIMIT ?4)
ORDER BY part, id LIMIT ?4`,
		stats: `SELECT
	count(*) FILTER (WHERE ` + heldSQL("n") + `),
	count(*) FILTER (WHERE progress IS NOT NULL AND NOT ` + heldSQL("n") + `),
	count(*) FILTER (WHERE progress IS NULL AND state = 'completed' AND expires_at > n),
	count(*) FILTER (WHERE progress IS NULL AND expires_at <= n),
	count(*) FILTER (WHERE progress IS NOT NULL AND tries > 0),
	min(created_at) FILTER (WHERE progress IS NOT NULL),
	coalesce(sum(length(body)) FILTER (WHERE progress IS NULL AND state = 'completed' AND expires_at > n), 0)
FROM ` + t + `, (SELECT ` + nowSQL(1) + ` AS n)`,
	}
}

// checkAcquisition refuses, with [idempotency.ErrInvalidConfig], what
// Acquire cannot store or judge.
func checkAcquisition(a backend.Acquisition) error {
	if err := a.Validate(); err != nil {
		return fmt.Errorf("sqlite: key %v: %w", a.Key, err)
	}
	return nil
}

// checkProgress refuses, with [idempotency.ErrInvalidConfig], a progress
// that a Phase cannot store.
func checkProgress(k idempotency.Key, progress []byte) error {
	if err := backend.CheckProgress(progress); err != nil {
		return fmt.Errorf("sqlite: key %v: %w", k, err)
	}
	return nil
}

// Acquire implements [backend.Stepper]. It needs the columns that
// [Store.Migrate] adds to a v0.1.0 table.
//
// It holds a key as [Store.Reserve] does, and waits as Reserve does: a
// completed live key is looked up first, outside any transaction; then the
// caller queues for the Store's write turn and SQLite's write lock, under
// the same bounds (a.Wait, a.Deadline, a.NoWait) and with the same errors.
// The phase's transaction holds the write lock, of the whole database,
// until Save, Release, Complete or Rollback: keep a phase short.
//
// In the transaction, the reservation's INSERT takes a new or expired key.
// Otherwise an UPDATE takes the lease of an unfinished key whose lease is
// free, ended by the store's clock, or a.Owner's. Since the transaction
// holds the write lock, no other writer, in this process or another, can
// take the lease in between. An unfinished key leased to another owner
// until later is reported with [idempotency.ErrInProgress] at once.
func (s *Store) Acquire(ctx context.Context, a backend.Acquisition) (backend.Phase[*sql.Tx], *backend.Record, error) {
	if err := checkAcquisition(a); err != nil {
		return nil, nil, err
	}
	now, err := s.testNow()
	if err != nil {
		return nil, nil, err
	}
	st, err := s.statements(ctx)
	if err != nil {
		return nil, nil, err
	}
	r := a.Reservation
	o, rec, err := s.openKey(ctx, st, r, now, true, true, insertReservation(st, r, now))
	if o == nil {
		return nil, rec, err
	}
	p := &phase{a: a, fp: a.Fingerprint}
	if !o.won {
		ok, err := s.claim(ctx, o.tx, a, now, p)
		if err == nil && !ok {
			rec, err = s.unclaimed(ctx, o.tx, a.Key, now)
		}
		if err != nil || !ok {
			o.end()
			s.releaseTurn()
			return nil, rec, err
		}
	}
	t, err := o.hold(ctx, s, st, r)
	if err != nil {
		s.releaseTurn()
		return nil, nil, err
	}
	p.txn = t
	return p, nil, nil
}

// claim takes the lease of a's unfinished key in tx, if it is free, ended
// or a.Owner's, and fills p from the row. It reports whether it took it.
func (s *Store) claim(ctx context.Context, tx *sql.Tx, a backend.Acquisition, now any, p *phase) (bool, error) {
	var tries int64
	err := queryRowIn(ctx, tx, s.stepStmt(func(st *stmts) *sql.Stmt { return st.claim }), s.q.steps.claim,
		a.Key.Scope, a.Key.ID, a.Owner, now, int64(a.Lease)).Scan(&p.fp, &p.progress, &tries)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, mapError(ctx, "acquire: lease", err)
	}
	if p.progress == nil {
		p.progress = []byte{} // an empty BLOB, not NULL
	}
	p.tries = int(tries)
	return true, nil
}

// unclaimed reads key's row in tx, which holds the write lock, when
// Acquire could neither insert nor lease it: the live record if it is
// completed, else an error wrapping [idempotency.ErrInProgress].
func (s *Store) unclaimed(ctx context.Context, tx *sql.Tx, key idempotency.Key, now any) (*backend.Record, error) {
	var row keyRow
	if err := row.scan(tx.QueryRowContext(ctx, s.q.steps.inspectBody, key.Scope, key.ID, now)); err != nil {
		return nil, mapError(ctx, "acquire: read key", err)
	}
	switch {
	case !row.progressNull:
		return nil, fmt.Errorf("%w: sqlite: key %v is leased to another owner until %v",
			idempotency.ErrInProgress, key, time.Unix(0, row.leaseEnds.Int64).UTC())
	case row.state != "completed":
		return nil, fmt.Errorf("%w: sqlite: key %v has a committed pending row until %v",
			idempotency.ErrInProgress, key, time.Unix(0, row.expires).UTC())
	}
	return record(key, row.fp, row.status, row.header, row.body, row.bodyNull, row.created, row.expires)
}

// Abandoned implements [backend.Stepper]: one SELECT outside any
// transaction, on the partial index of unfinished keys by lease end. In
// WAL mode it waits for no writer (outside it, see [Store.Inspect]). q.Limit must be 1 to 1000, q.Grace and
// q.MaxTries not negative, else an error wraps
// [idempotency.ErrInvalidConfig].
func (s *Store) Abandoned(ctx context.Context, q backend.AbandonedQuery) ([]backend.AbandonedKey, error) {
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("sqlite: abandoned: %w", err)
	}
	now, err := s.testNow()
	if err != nil {
		return nil, err
	}
	var out []backend.AbandonedKey
	err = retryBusyFor(ctx, readWait, func() error {
		out = nil
		rows, err := s.db.QueryContext(ctx, s.q.steps.abandoned, now, int64(q.Grace), q.MaxTries, q.Limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				k            backend.AbandonedKey
				tries, ended int64
			)
			if err := rows.Scan(&k.Key.Scope, &k.Key.ID, &k.Fingerprint, &k.Progress, &tries, &ended); err != nil {
				return err
			}
			if k.Progress == nil {
				k.Progress = []byte{}
			}
			k.Tries, k.LeaseEnded = int(tries), time.Unix(0, ended).UTC()
			out = append(out, k)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, mapError(ctx, "abandoned", err)
	}
	return out, nil
}

// phase is a transaction of [Store.Acquire]: a reservation (its txn) that
// ends with Save, Release, Complete or Rollback.
type phase struct {
	*txn
	a        backend.Acquisition
	fp       string
	progress []byte
	tries    int
}

// Fingerprint is the fingerprint the operation started with.
func (p *phase) Fingerprint() string { return p.fp }

// Progress is the progress last saved, nil for a new key.
func (p *phase) Progress() []byte { return p.progress }

// Tries is how many runs released the key after a failure.
func (p *phase) Tries() int { return p.tries }

// Save commits the phase with progress and the owner's lease until the
// store's clock plus the Acquisition's Lease.
func (p *phase) Save(ctx context.Context, progress []byte) error {
	return p.commitProgress(ctx, "save", progress, p.s.q.steps.save, p.s.stepStmt(func(st *stmts) *sql.Stmt { return st.save }), p.a.Owner, int64(p.a.Lease))
}

// Release commits the phase with progress, the lease ended at the store's
// clock now and one more try.
func (p *phase) Release(ctx context.Context, progress []byte) error {
	return p.commitProgress(ctx, "release", progress, p.s.q.steps.release, nil)
}

// stepStmt is the statement of the Store's prepared ones that pick
// chooses, nil if there is none (not prepared yet, or the table lacked its
// columns then).
func (s *Store) stepStmt(pick func(*stmts) *sql.Stmt) *sql.Stmt {
	if st := s.prepared.Load(); st != nil {
		return pick(st)
	}
	return nil
}

// queryRowIn runs query with args in tx: as prepared, the same query
// prepared, if it is not nil.
func queryRowIn(ctx context.Context, tx *sql.Tx, prepared *sql.Stmt, query string, args ...any) *sql.Row {
	if prepared != nil {
		return tx.StmtContext(ctx, prepared).QueryRowContext(ctx, args...)
	}
	return tx.QueryRowContext(ctx, query, args...)
}

// execIn is queryRowIn for a statement that returns no rows.
func execIn(ctx context.Context, tx *sql.Tx, prepared *sql.Stmt, query string, args ...any) (sql.Result, error) {
	if prepared != nil {
		return tx.StmtContext(ctx, prepared).ExecContext(ctx, args...)
	}
	return tx.ExecContext(ctx, query, args...)
}

// commitProgress stores progress with query (parameters: progress, scope,
// id, now, then more), or with prepared if it is not nil (the same query
// prepared), and commits. A bad progress rolls the phase back.
func (p *phase) commitProgress(ctx context.Context, op string, progress []byte, query string, prepared *sql.Stmt, more ...any) error {
	if p.ended {
		return errEnded
	}
	if err := checkProgress(p.key, progress); err != nil {
		_ = p.Rollback(ctx)
		return err
	}
	p.ended = true
	cur := p.commitBusyTimeout
	err := p.commitWith(ctx, cur, func(now any) error {
		res, err := execIn(ctx, p.tx, prepared, query, append([]any{progress, p.key.Scope, p.key.ID, now}, more...)...)
		if err != nil {
			return mapError(ctx, op, err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("sqlite: %s: the row of key %v is gone (%d rows changed, %v)", op, p.key, n, err)
		}
		return nil
	})
	p.end(cur)
	return err
}

// Complete stores resp as the key's completed record, clears its progress,
// owner, lease and tries, and commits, as [Store.Reserve]'s Complete does.
// The record keeps the creation time of the operation's first phase.
func (p *phase) Complete(ctx context.Context, resp idempotency.Response) error {
	if p.ended {
		return errEnded
	}
	p.ended = true
	cur := p.commitBusyTimeout
	err := p.commitWith(ctx, cur, func(now any) error {
		changed, err := changedOne(execIn(ctx, p.tx, p.s.stepStmt(func(st *stmts) *sql.Stmt { return st.stepComplete }), p.s.q.steps.complete,
			resp.Status, backend.MarshalHeader(resp.Header), resp.Body, p.key.Scope, p.key.ID, now, int64(p.ttl)))
		if err != nil {
			return mapError(ctx, "complete", err)
		}
		if !changed {
			return fmt.Errorf("sqlite: complete: the row of key %v is gone (no row changed)", p.key)
		}
		return nil
	})
	p.end(cur)
	return err
}
