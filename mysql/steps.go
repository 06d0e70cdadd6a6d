package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// stepSQL are the statements of multi-step operations and of the key
// administration, on one table.
type stepSQL struct {
	read, readBody string // the row with its step columns (consistent read)
	lockRead       string // read FOR UPDATE; the caller adds NOWAIT or a bound
	lease          string // takes the lease in the transaction
	save, release  string
	complete       string
	// completeFold is complete, a check that it changed the row, and
	// COMMIT in one MariaDB compound statement (see foldConn).
	completeFold string
	exists       string // the row, locked (the phase holds it already)
	probeShare   string // MariaDB: a shared lock, NOWAIT
	probeShareMy string // MySQL: the same
	forgetRead   string // read FOR UPDATE NOWAIT
	forget       string
	abandoned    string
	listFirst    string // the unfinished keys of a scope, after an id
	listRest     string // the others
	stats        string
}

// stepCols are the columns of a stepRow, body or NULL in its place. Every
// read also reports the server's clock, by which the store judges the row.
func stepCols(body string) string {
	return `fingerprint, state, status, header, ` + body + `, COALESCE(LENGTH(body), 0), created_at, expires_at,
progress, progress IS NOT NULL, owner, lease_ends, tries, ` + nowSQL
}

// maxExpirySQL is [backend.MaxExpiry] in the table's unit.
const maxExpirySQL = "9223372036854775807"

func newStepSQL(q string) stepSQL {
	const where = ` WHERE scope = ? AND id = ?`
	st := stepSQL{
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
	st.completeFold = foldCommit(st.complete)
	return st
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

// Abandoned implements [backend.Stepper] with one consistent read
// (no lock), on the index on lease_ends. q.Limit must be 1 to 1000 and
// q.Grace not negative, else the error wraps
// [idempotency.ErrInvalidConfig].
func (s *Store) Abandoned(ctx context.Context, q backend.AbandonedQuery) ([]backend.AbandonedKey, error) {
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("mysql: abandoned: %w", err)
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
	var out []backend.AbandonedKey
	for rows.Next() {
		var (
			scope, id, fp, progress []byte
			ak                      backend.AbandonedKey
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
