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

var (
	_ backend.KeyAdmin  = (*Store)(nil)
	_ backend.KeyLister = (*Store)(nil)
)

// infoColumns are the columns of a key's row that [infoRow] scans, body
// being the SQL of the body column (NULL when it is not asked for). The
// statement names the row k and the clock subquery n.
func infoColumns(body string) string {
	return `k.fingerprint, k.state, k.status, k.header, ` + body + `, octet_length(k.body), k.created_at, k.expires_at,
	k.expires_at <= n.now, k.progress, k.tries, k.lease_ends, k.lease_ends > n.now`
}

// adminStatements builds the statements of key administration on the quoted
// table q (see stepStatements).
func adminStatements(st *statements, q string) {
	// inspect reads the key's row, if any, and whether a transaction holds
	// the key's advisory lock, from pg_locks (taking no lock): scope $1, id
	// $2, the clock $3, whether to read the body $4, the lock id's high
	// and low halves $5 and $6 (pg_locks shows a bigint advisory lock that
	// way, with objsubid 1).
	st.inspect = `SELECT k.scope IS NOT NULL, ` + infoColumns(`CASE WHEN $4::bool THEN k.body END`) + `, l.held
FROM ` + nowFrom(3) + `
CROSS JOIN (SELECT EXISTS (SELECT 1 FROM pg_locks
	WHERE locktype = 'advisory' AND granted AND objsubid = 1
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid::int8 = $5::int8 AND objid::int8 = $6::int8) AS held) AS l
LEFT JOIN ` + q + ` AS k ON k.scope = $1::text AND k.id = $2::text`
	// forgetRead reads the key's row in Forget's transaction, after its
	// advisory lock: scope $1, id $2, the clock $3. forget deletes it.
	st.forgetRead = `SELECT ` + infoColumns(`NULL::bytea`) + `
FROM ` + nowFrom(3) + `, ` + q + ` AS k
WHERE k.scope = $1::text AND k.id = $2::text`
	st.forget = `DELETE FROM ` + q + ` WHERE scope = $1::text AND id = $2::text`
	// list: scope $1, the clock $2, the cursor ($3 whether its key was
	// unfinished, NULL for the first page; $4 its id), at most $5 rows.
	// Unfinished rows (with progress) sort first, then the others, each by
	// id in byte order (the column's collation is "C").
	st.list = `SELECT k.id, ` + infoColumns(`NULL::bytea`) + `
FROM ` + nowFrom(2) + `, ` + q + ` AS k
WHERE k.scope = $1::text AND ($3::bool IS NULL OR (k.progress IS NULL, k.id) > (NOT $3::bool, $4::text))
ORDER BY k.progress IS NULL, k.id
LIMIT $5::int8`
	// stats counts the rows by state by the clock $1. A committed pending
	// row that is no operation's (only SQL of fn's own could commit one)
	// counts as held until it expires.
	st.stats = `SELECT
	count(*) FILTER (WHERE k.progress IS NOT NULL AND k.lease_ends > n.now
		OR k.progress IS NULL AND k.state = 'pending' AND k.expires_at > n.now),
	count(*) FILTER (WHERE k.progress IS NOT NULL AND NOT COALESCE(k.lease_ends > n.now, false)),
	count(*) FILTER (WHERE k.progress IS NULL AND k.state = 'completed' AND k.expires_at > n.now),
	count(*) FILTER (WHERE k.progress IS NULL AND k.expires_at <= n.now),
	count(*) FILTER (WHERE k.progress IS NOT NULL AND k.tries > 0),
	min(k.created_at) FILTER (WHERE k.progress IS NOT NULL),
	COALESCE(sum(octet_length(k.body)) FILTER (WHERE k.progress IS NULL AND k.state = 'completed' AND k.expires_at > n.now), 0)
FROM ` + nowFrom(1) + `, ` + q + ` AS k`
}

// infoRow is a key's row as infoColumns read it; its fields are nil for
// the NULLs of an absent row (inspect's outer join).
type infoRow struct {
	fp, state          *string
	status, tries      *int32
	header, body       []byte
	bodyLen            *int32
	created, expiresAt *time.Time
	expired, leaseLive *bool
	progress           []byte
	leaseEnds          *time.Time
}

// dest is the scan destinations of infoColumns.
func (r *infoRow) dest() []any {
	return []any{&r.fp, &r.state, &r.status, &r.header, &r.body, &r.bodyLen, &r.created, &r.expiresAt,
		&r.expired, &r.progress, &r.tries, &r.leaseEnds, &r.leaseLive}
}

// info describes the row of key; locked says that a transaction holds the
// key's advisory lock (a reservation or a phase), when the caller can tell.
func (r *infoRow) info(key idempotency.Key, locked bool) (*backend.KeyInfo, error) {
	if r.fp == nil || r.state == nil || r.created == nil || r.expiresAt == nil || r.expired == nil {
		return nil, fmt.Errorf("postgres: key %v: incomplete row", key)
	}
	in := &backend.KeyInfo{Key: key, Fingerprint: *r.fp, CreatedAt: *r.created, ExpiresAt: *r.expiresAt}
	if r.bodyLen != nil {
		in.BodyLen = int(*r.bodyLen)
	}
	if r.tries != nil {
		in.Tries = int(*r.tries)
	}
	leaseLive := r.leaseLive != nil && *r.leaseLive
	switch {
	case r.progress != nil:
		in.State = backend.KeyUnfinished
		if leaseLive || locked {
			in.State = backend.KeyInProgress
		}
		in.Progress = r.progress
		if r.leaseEnds != nil {
			in.LeaseEnds = *r.leaseEnds
		}
		return in, nil
	case *r.expired && locked:
		// Taken over in an open transaction: the row is the old record's.
		return &backend.KeyInfo{Key: key, State: backend.KeyInProgress}, nil
	case *r.expired:
		in.State = backend.KeyExpired
	case *r.state == "completed":
		in.State = backend.KeyCompleted
	default:
		// A committed pending row that is no operation's: held until it
		// expires, as Reserve says.
		in.State = backend.KeyInProgress
		return in, nil
	}
	if r.status != nil {
		in.Status = int(*r.status)
	}
	h, err := backend.UnmarshalHeader(r.header)
	if err != nil {
		return nil, fmt.Errorf("postgres: stored header of key %v: %w", key, err)
	}
	in.Header, in.Body = h, r.body
	return in, nil
}

// lockHalves are the halves of a key's advisory lock id as pg_locks shows
// them: the high one in classid, the low one in objid.
func lockHalves(id int64) (hi, lo int64) {
	return int64(uint64(id) >> 32), int64(uint64(id) & 0xffffffff)
}

// Inspect implements [backend.KeyAdmin] with one SELECT, which takes
// no lock and waits for none. Besides the key's row, it reads from pg_locks
// whether a transaction holds the key's advisory lock. So it reports
// [backend.KeyInProgress] for a key held by an open transaction of Reserve or
// Acquire, also a new key, which has no row until it commits (its KeyInfo
// then holds only Key and State). It cannot tell such a holder from
// unrelated code of the database that holds an advisory lock with the
// same 64-bit id (about one chance in 2^64).
func (s *Store) Inspect(ctx context.Context, key idempotency.Key, body bool) (*backend.KeyInfo, error) {
	now, err := s.now()
	if err != nil {
		return nil, err
	}
	hi, lo := lockHalves(lockID(s.quoted, key))
	var (
		r            infoRow
		exists, held bool
	)
	dest := append(append([]any{&exists}, r.dest()...), &held)
	err = s.q.queryRow(ctx, s.sql.inspect, execMode, key.Scope, key.ID, now, body, hi, lo).Scan(dest...)
	switch {
	case err != nil:
		return nil, s.mapError(ctx, fmt.Errorf("postgres: inspect key %v: %w", key, err), false)
	case !exists && held:
		return &backend.KeyInfo{Key: key, State: backend.KeyInProgress}, nil
	case !exists:
		return nil, fmt.Errorf("postgres: key %v: %w", key, idempotency.ErrNotFound)
	}
	return r.info(key, held)
}

// Forget implements [backend.KeyAdmin] in one short READ COMMITTED
// transaction of two round trips: BEGIN, the key's advisory lock if it is
// free (never waiting) and the row; then the DELETE with COMMIT. A key
// whose lock another transaction holds (Reserve, Acquire) or that a live
// lease holds is refused with [idempotency.ErrInProgress].
func (s *Store) Forget(ctx context.Context, key idempotency.Key) (*backend.KeyInfo, error) {
	now, err := s.now()
	if err != nil {
		return nil, err
	}
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.abandon(ctx)
	b := &pgx.Batch{}
	b.Queue(beginReadCommitted)
	b.Queue(s.sql.tryLock, lockID(s.quoted, key))
	b.Queue(s.sql.forgetRead, key.Scope, key.ID, now)
	br := conn.send(ctx, b)
	var (
		lk    lockResult
		r     infoRow
		found = true
	)
	_, err = br.Exec()
	if err == nil {
		lk, err = scanLock(br, false)
	}
	if err == nil {
		conn.noteBackend(lk.pid)
		if err = br.QueryRow().Scan(r.dest()...); errors.Is(err, pgx.ErrNoRows) {
			found, err = false, nil
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, s.mapError(ctx, fmt.Errorf("postgres: forget key %v: %w", key, err), false)
	}
	if !lk.locked {
		return nil, fmt.Errorf("postgres: forget key %v: %w", key, idempotency.ErrInProgress)
	}
	if !found {
		return nil, fmt.Errorf("postgres: key %v: %w", key, idempotency.ErrNotFound)
	}
	in, err := r.info(key, false)
	if err != nil {
		return nil, err
	}
	if in.State == backend.KeyInProgress {
		return nil, fmt.Errorf("postgres: forget key %v: %w", key, idempotency.ErrInProgress)
	}
	b = &pgx.Batch{}
	b.Queue(s.sql.forget, key.Scope, key.ID)
	b.Queue("commit")
	br = conn.send(ctx, b)
	deleted, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return nil, s.mapError(ctx, fmt.Errorf("postgres: forget key %v: %w", key, err), false)
	case deleted.RowsAffected() != 1: // an expired row purged meanwhile
		return nil, fmt.Errorf("postgres: key %v: %w", key, idempotency.ErrNotFound)
	}
	return in, nil
}

// List implements [backend.KeyLister] with one SELECT on the scope's
// rows; bodies are not read. Only committed rows are listed: a new key
// held in an open transaction has none yet. A key is [backend.KeyInProgress]
// here by a live lease (or a committed pending row), not by an open
// transaction on it, which only [Store.Inspect] tells.
func (s *Store) List(ctx context.Context, q backend.ListQuery) (backend.KeyPage, error) {
	if err := q.Validate(); err != nil {
		return backend.KeyPage{}, fmt.Errorf("postgres: list: %w", err)
	}
	now, err := s.now()
	if err != nil {
		return backend.KeyPage{}, err
	}
	var afterFirst, afterID any
	if q.After != nil {
		afterFirst, afterID = q.After.Unfinished, q.After.ID
	}
	rows, err := s.q.query(ctx, s.sql.list, execMode, q.Scope, now, afterFirst, afterID, int64(q.Limit)+1)
	if err != nil {
		return backend.KeyPage{}, s.mapError(ctx, fmt.Errorf("postgres: list keys: %w", err), false)
	}
	defer rows.Close()
	var page backend.KeyPage
	for rows.Next() {
		var (
			id string
			r  infoRow
		)
		if err := rows.Scan(append([]any{&id}, r.dest()...)...); err != nil {
			return backend.KeyPage{}, s.mapError(ctx, fmt.Errorf("postgres: list keys: %w", err), false)
		}
		in, err := r.info(idempotency.Key{Scope: q.Scope, ID: id}, false)
		if err != nil {
			return backend.KeyPage{}, err
		}
		page.Keys = append(page.Keys, *in)
	}
	if err := rows.Err(); err != nil {
		return backend.KeyPage{}, s.mapError(ctx, fmt.Errorf("postgres: list keys: %w", err), false)
	}
	if len(page.Keys) > q.Limit {
		page.Keys = page.Keys[:q.Limit]
		last := page.Keys[q.Limit-1]
		page.Next = &backend.ListCursor{Unfinished: last.Progress != nil, ID: last.Key.ID}
	}
	return page, nil
}

// Stats implements [backend.KeyLister] with one SELECT over the
// table, by the store's clock. Held counts the unfinished keys whose lease
// is live (not the keys held by open transactions, which have no committed
// row to count).
func (s *Store) Stats(ctx context.Context) (backend.Stats, error) {
	now, err := s.now()
	if err != nil {
		return backend.Stats{}, err
	}
	var (
		st     backend.Stats
		oldest *time.Time
	)
	err = s.q.queryRow(ctx, s.sql.stats, execMode, now).Scan(&st.InProgress, &st.Unfinished, &st.Completed, &st.Expired, &st.Failing, &oldest, &st.BodyBytes)
	if err != nil {
		return backend.Stats{}, s.mapError(ctx, fmt.Errorf("postgres: stats: %w", err), false)
	}
	if oldest != nil {
		st.OldestUnfinished = *oldest
	}
	return st, nil
}
