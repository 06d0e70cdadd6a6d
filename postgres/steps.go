package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

var _ backend.Stepper[pgx.Tx] = (*Store)(nil)

// stepStatements builds the statements of multi-step operations and of key
// administration on the quoted table q. Every parameter is cast or lands in
// a column, so that they run as unnamed statements behind a pooler (see
// send.go); the clock parameter is NULL for the server's clock (nowFrom).
func stepStatements(st *statements, q string) {
	// acquire reads the key's row in the transaction that holds the key's
	// advisory lock: scope $1, id $2, the clock $3.
	st.acquire = `SELECT k.fingerprint, k.state, k.status, k.header, k.body, k.created_at, k.expires_at, k.expires_at <= n.now,
	k.progress, k.owner, k.lease_ends, k.lease_ends > n.now, k.tries
FROM ` + nowFrom(3) + `, ` + q + ` AS k
WHERE k.scope = $1::text AND k.id = $2::text`
	// lockRow locks the row acquire read, under REPEATABLE READ and
	// SERIALIZABLE: a row changed since the snapshot fails it with a
	// serialization failure.
	st.lockRow = `SELECT 1 FROM ` + q + ` WHERE scope = $1::text AND id = $2::text FOR UPDATE`
	// claimNew writes a new key's row at once, with an empty progress,
	// under REPEATABLE READ and SERIALIZABLE: scope $1, id $2, fingerprint
	// $3, its creation $4 (NULL: the transaction's start). A row committed
	// after the snapshot fails it with a serialization failure.
	st.claimNew = `INSERT INTO ` + q + ` (scope, id, fingerprint, state, created_at, expires_at, progress)
VALUES ($1::text, $2::text, $3::text, 'pending', COALESCE($4::timestamptz, now()), ` + maxExpirySQL + `, ''::bytea)
ON CONFLICT (scope, id) DO NOTHING`
	// saveNew writes a new key's unfinished row: scope $1, id $2,
	// fingerprint $3, its creation $4 (NULL: the transaction's start), the
	// clock $5, progress $6, owner $7 (NULL for none), the lease $8 (counted
	// from the clock) and tries $9.
	st.saveNew = `INSERT INTO ` + q + ` (scope, id, fingerprint, state, created_at, expires_at, progress, owner, lease_ends, tries)
SELECT $1::text, $2::text, $3::text, 'pending', COALESCE($4::timestamptz, now()), ` + maxExpirySQL + `,
	$6::bytea, $7::text, ` + expirySQL("n.now", 8) + `, $9::int4
FROM ` + nowFrom(5)
	// saveExisting writes an unfinished row's progress and lease: scope
	// $1, id $2, the clock $3, progress $4, owner $5 (NULL for none), the
	// lease $6 and tries to add $7.
	st.saveExisting = `UPDATE ` + q + ` AS k SET progress = $4::bytea, owner = $5::text, lease_ends = ` + expirySQL("n.now", 6) + `,
	tries = k.tries + $7::int4, expires_at = ` + maxExpirySQL + `
FROM ` + nowFrom(3) + `
WHERE k.scope = $1::text AND k.id = $2::text AND k.progress IS NOT NULL`
	// completeSteps completes an unfinished row, keeping its creation:
	// scope $1, id $2, status $3, header $4, body $5, the clock $6, TTL $7.
	st.completeSteps = `UPDATE ` + q + ` SET state = 'completed', status = $3::int4, header = $4::bytea, body = $5::bytea,
	expires_at = ` + expirySQL(`COALESCE($6::timestamptz, clock_timestamp())`, 7) + `,
	progress = NULL, owner = NULL, lease_ends = NULL, tries = 0
WHERE scope = $1::text AND id = $2::text AND progress IS NOT NULL`
	// abandoned: the clock $1, the grace $2 and in microseconds, tries
	// under $3, at most $4 rows. The bound is computed once (an InitPlan),
	// so that the lease_ends index serves it.
	st.abandoned = `SELECT scope, id, fingerprint, progress, tries, lease_ends FROM ` + q + `
WHERE progress IS NOT NULL
	AND lease_ends <= (SELECT COALESCE($1::timestamptz, clock_timestamp()) - $2::int8 * interval '1 microsecond')
	AND tries < $3::int8
ORDER BY lease_ends LIMIT $4::int8`
	adminStatements(st, q)
}

// checkAcquisition validates what Acquire is asked for, before anything is
// sent.
func checkAcquisition(a backend.Acquisition) error {
	if err := a.Validate(); err != nil {
		return fmt.Errorf("postgres: key %v: %w", a.Key, err)
	}
	return nil
}

// checkProgress validates the progress a phase is to store.
func checkProgress(progress []byte) error {
	if err := backend.CheckProgress(progress); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	return nil
}

// Acquire implements [backend.Stepper]. It acquires one connection
// and, in one round trip, begins the transaction, takes the key's advisory
// lock (at once, or waiting up to a.Wait as [Store.Reserve] does) and reads
// the key's row. The lock is the compare-and-swap: every holder of the key,
// a reservation of [Store.Reserve] or a phase, holds it for its whole
// transaction, so of the callers that find an unfinished key's lease free
// or ended, the one that holds the lock gets the phase and the others
// ErrInProgress (or wait for it, then find the lease it saved). The lease
// is written when the phase commits (Save), not when it is taken: until
// then the lock holds the key. Under REPEATABLE READ and SERIALIZABLE, one
// more round trip locks the row read, so that a row changed since the
// transaction's snapshot fails with [backend.ErrConflict] before the
// phase's writes.
//
// Acquire needs the columns of multi-step operations: on a table of v0.1.0
// not migrated yet ([Store.Migrate]) it fails with the server's
// undefined_column error.
func (s *Store) Acquire(ctx context.Context, a backend.Acquisition) (backend.Phase[pgx.Tx], *backend.Record, error) {
	p, rec, err := s.acquirePhase(ctx, a)
	if p == nil {
		return nil, rec, err
	}
	return pgxPhase{p}, nil, nil
}

// acquirePhase is Acquire on either front end.
func (s *Store) acquirePhase(ctx context.Context, a backend.Acquisition) (*phase, *backend.Record, error) {
	if err := checkAcquisition(a); err != nil {
		return nil, nil, err
	}
	now, err := s.now()
	if err != nil {
		return nil, nil, err
	}
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	p, rec, err := s.acquire(ctx, conn, a, now)
	if p == nil {
		conn.abandon(ctx)
		return nil, rec, err
	}
	return p, nil, nil
}

// opRow is the key's row as acquire reads it.
type opRow struct {
	exists    bool
	fp        string
	state     string
	rec       *backend.Record // live and completed
	created   time.Time
	expired   bool
	progress  []byte
	owner     *string
	leaseEnds *time.Time
	leaseLive bool
	tries     int
}

// acquire is Acquire on conn; the caller releases conn unless a phase is
// returned.
func (s *Store) acquire(ctx context.Context, conn link, a backend.Acquisition, now any) (*phase, *backend.Record, error) {
	var row opRow
	lk, err := s.lockAndRead(ctx, conn, a.Reservation, now, s.sql.acquire, "acquire", func(r pgx.Row) (err error) {
		row, err = scanOpRow(r, a.Key)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	conn.began() // the transaction of lockAndRead's batch, before any other is sent
	unfinished := row.progress != nil
	switch {
	case row.rec != nil:
		return nil, row.rec, nil
	case unfinished && row.leaseLive && (row.owner == nil || *row.owner != a.Owner):
		return nil, nil, fmt.Errorf("postgres: key %v leased until %v: %w", a.Key, *row.leaseEnds, idempotency.ErrInProgress)
	case !lk.locked:
		return nil, nil, fmt.Errorf("postgres: key %v: %w", a.Key, idempotency.ErrInProgress)
	case row.exists && !unfinished && !row.expired:
		// A committed pending row that is no operation's: held until it
		// expires, as Reserve says.
		return nil, nil, fmt.Errorf("postgres: key %v: %w", a.Key, idempotency.ErrInProgress)
	}
	if row.exists && !lk.readCommitted() {
		b := &pgx.Batch{}
		b.Queue(s.sql.lockRow, a.Key.Scope, a.Key.ID)
		br := conn.send(ctx, b)
		_, err := br.Exec()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, nil, s.mapError(ctx, fmt.Errorf("postgres: acquire key %v: lock its row: %w", a.Key, err), false)
		}
	}
	p := &phase{
		txn: txn{s: s, l: conn, key: a.Key, fp: a.Fingerprint, now: now, ttl: a.TTL, expired: row.expired},
		a:   a,
	}
	if unfinished {
		p.fp, p.progress, p.tries, p.existing = row.fp, row.progress, row.tries, true
	}
	if !row.exists && !lk.readCommitted() {
		// A new key under REPEATABLE READ or SERIALIZABLE: the snapshot
		// may predate a row that another phase committed while this one
		// waited for the key's lock. Writing the key's row now turns that
		// into a serialization failure (ErrConflict: the core tries again,
		// on a new snapshot), never into a second phase.
		b := &pgx.Batch{}
		b.Queue(s.sql.claimNew, a.Key.Scope, a.Key.ID, a.Fingerprint, now)
		br := conn.send(ctx, b)
		tag, err := br.Exec()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("%w: the key's row appeared", backend.ErrConflict)
		}
		if err != nil { // the caller rolls back (abandon)
			return nil, nil, s.mapError(ctx, fmt.Errorf("postgres: acquire key %v: claim its row: %w", a.Key, err), false)
		}
		p.existing = true // Save and Complete update the claimed row
	}
	return p, nil, nil
}

// scanOpRow scans the row of the acquire statement.
func scanOpRow(r pgx.Row, key idempotency.Key) (opRow, error) {
	var (
		row                opRow
		status, tries      *int32
		header, body       []byte
		expiresAt, created time.Time
		leaseLive          *bool
	)
	err := r.Scan(&row.fp, &row.state, &status, &header, &body, &created, &expiresAt, &row.expired,
		&row.progress, &row.owner, &row.leaseEnds, &leaseLive, &tries)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return opRow{}, nil
	case err != nil:
		return opRow{}, err
	}
	row.exists, row.created = true, created
	row.leaseLive = leaseLive != nil && *leaseLive
	if tries != nil {
		row.tries = int(*tries)
	}
	if row.progress != nil {
		row.expired = false // an unfinished row never expires
		return row, nil
	}
	if row.state != "completed" || row.expired {
		return row, nil
	}
	if status == nil {
		return opRow{}, fmt.Errorf("postgres: completed key %v has no status", key)
	}
	h, err := backend.UnmarshalHeader(header)
	if err != nil {
		return opRow{}, fmt.Errorf("postgres: stored header of key %v: %w", key, err)
	}
	row.rec = &backend.Record{Key: key, Fingerprint: row.fp, Status: int(*status), Header: h, Body: body,
		CreatedAt: created, ExpiresAt: expiresAt}
	return row, nil
}

// phase is one transaction of [Store.Acquire] on an operation's key: a
// [txn] (its connection, transaction, key and test clock reading) plus what
// the key's unfinished row held.
type phase struct {
	txn
	a        backend.Acquisition
	progress []byte // nil for a new key
	tries    int
	existing bool // the key has an unfinished row
}

var _ backend.Phase[pgx.Tx] = pgxPhase{}

// Fingerprint is the operation's, or the Acquisition's for a new key.
func (p *phase) Fingerprint() string { return p.fp }

// Progress is the progress last saved, nil for a new key.
func (p *phase) Progress() []byte { return p.progress }

// Tries is how many runs released the key after a failure.
func (p *phase) Tries() int { return p.tries }

// Save commits the phase with progress and the Acquisition's owner's lease
// until the store's clock plus its Lease, in one round trip.
func (p *phase) Save(ctx context.Context, progress []byte) error {
	return p.commitProgress(ctx, "save", progress, p.a.Owner, p.a.Lease, 0)
}

// Release commits the phase with progress, no owner, the lease ended at
// the store's clock now and one more try, in one round trip.
func (p *phase) Release(ctx context.Context, progress []byte) error {
	return p.commitProgress(ctx, "release", progress, nil, 0, 1)
}

// commitProgress writes the key's unfinished row and commits. A bad
// progress rolls the phase back.
func (p *phase) commitProgress(ctx context.Context, what string, progress []byte, owner any, lease time.Duration, try int32) error {
	if err := checkProgress(progress); err != nil {
		if p.done {
			return fmt.Errorf("postgres: key %v: %w", p.key, pgx.ErrTxClosed)
		}
		if rerr := p.Rollback(ctx); rerr != nil {
			return fmt.Errorf("%w (and rolling back: %w)", err, rerr)
		}
		return err
	}
	k := p.key
	return p.finish(ctx, what, func(b *pgx.Batch, now any) {
		switch {
		case p.existing:
			b.Queue(p.s.sql.saveExisting, k.Scope, k.ID, now, progress, owner, lease, try)
		case p.expired:
			b.Queue(p.s.sql.deleteExpired, k.Scope, k.ID, p.now)
			fallthrough
		default:
			b.Queue(p.s.sql.saveNew, k.Scope, k.ID, p.fp, p.now, now, progress, owner, lease, try)
		}
	})
}

// Complete stores resp as the key's completed record and commits, in one
// round trip. An unfinished row keeps its creation time.
func (p *phase) Complete(ctx context.Context, resp idempotency.Response) error {
	if !p.existing {
		return p.txn.Complete(ctx, resp)
	}
	header := backend.MarshalHeader(resp.Header)
	return p.finish(ctx, "complete", func(b *pgx.Batch, now any) {
		b.Queue(p.s.sql.completeSteps, p.key.Scope, p.key.ID, int32(resp.Status), header, resp.Body, now, p.ttl)
	})
}

// Abandoned implements [backend.Stepper] with one SELECT, served by
// the partial index on lease_ends. It locks nothing.
func (s *Store) Abandoned(ctx context.Context, q backend.AbandonedQuery) ([]backend.AbandonedKey, error) {
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("postgres: abandoned: %w", err)
	}
	now, err := s.now()
	if err != nil {
		return nil, err
	}
	rows, err := s.q.query(ctx, s.sql.abandoned, execMode, now, q.Grace.Microseconds(), int64(q.MaxTries), int64(q.Limit))
	if err != nil {
		return nil, s.mapError(ctx, fmt.Errorf("postgres: abandoned keys: %w", err), false)
	}
	var out []backend.AbandonedKey
	for rows.Next() {
		var (
			k     backend.AbandonedKey
			tries int32
		)
		if err := rows.Scan(&k.Key.Scope, &k.Key.ID, &k.Fingerprint, &k.Progress, &tries, &k.LeaseEnded); err != nil {
			rows.Close()
			return nil, s.mapError(ctx, fmt.Errorf("postgres: abandoned keys: %w", err), false)
		}
		k.Tries = int(tries)
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, s.mapError(ctx, fmt.Errorf("postgres: abandoned keys: %w", err), false)
	}
	return out, nil
}
