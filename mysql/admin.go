package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// info describes the committed row rw of key k, as Inspect reports it
// when no open transaction holds it. It never reads rw.body: the caller
// sets Body when asked.
func (rw stepRow) info(k idempotency.Key) (*backend.KeyInfo, error) {
	info := &backend.KeyInfo{
		Key:         k,
		Fingerprint: string(rw.fingerprint),
		CreatedAt:   time.Unix(0, rw.created).UTC(),
		ExpiresAt:   time.Unix(0, rw.expires).UTC(),
	}
	switch {
	case rw.progress != nil:
		info.State = backend.KeyUnfinished
		if rw.leaseLive() {
			info.State = backend.KeyInProgress
		}
		info.ExpiresAt = backend.MaxExpiry()
		info.Progress, info.Tries = rw.progress, rw.tries
		if rw.leased {
			info.LeaseEnds = time.Unix(0, rw.leaseEnds).UTC()
		}
		return info, nil
	case !rw.live():
		info.State = backend.KeyExpired
	case rw.state == stateCompleted:
		info.State = backend.KeyCompleted
	default:
		// A pending row committed without its completion: Reserve reports
		// it in progress until its provisional expiry.
		info.State = backend.KeyInProgress
		return info, nil
	}
	if rw.state == stateCompleted {
		h, err := backend.UnmarshalHeader(rw.header)
		if err != nil {
			return nil, fmt.Errorf("mysql: key %v: stored header: %w", k, err)
		}
		info.Status, info.Header, info.BodyLen = rw.status, h, int(rw.bodyLen)
	}
	return info, nil
}

// Inspect implements [backend.KeyAdmin]. It reads the key's committed
// row with a consistent read (the body column only when body is true).
//
// What it can tell of open transactions: a live completed record, or an
// unfinished key under a live lease, is reported as it is committed,
// without a lock. Otherwise (no committed row, an unfinished key whose
// lease ended, an expired row) it probes the row with a shared locking
// read that never waits (LOCK IN SHARE MODE NOWAIT on MariaDB, FOR SHARE
// NOWAIT on MySQL, the first syntax error telling which), in a READ COMMITTED transaction, which locks no gap.
// A row that an open transaction holds (a new key reserved by Reserve or
// Acquire, an expired row being taken over, an unfinished key in an open
// phase) is then reported [backend.KeyInProgress]; a new key so held has
// only Key and State. The probe's shared lock lasts one statement and
// conflicts only with writers of the row: a caller that refuses to wait
// (Wait == 0) and arrives in that instant may be told the key is in
// progress, or retry a conflict. On a Galera cluster the probe sees only
// the transactions of the node it runs on.
//
// A pending row committed without its completion (fn committed the
// reservation's transaction) is also reported KeyInProgress: Reserve reports it
// in progress until its provisional expiry.
func (s *Store) Inspect(ctx context.Context, key idempotency.Key, body bool) (*backend.KeyInfo, error) {
	now, err := s.testNow()
	if err != nil {
		return nil, err
	}
	k := keyOf(key)
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, mapError(ctx, err, false, "mysql: connection for key %v", key)
	}
	defer conn.Close()
	q := s.steps.read
	if body {
		q = s.steps.readBody
	}
	rw, err := scanStep(conn.QueryRowContext(ctx, q, k.scope, k.id), now)
	if err != nil {
		return nil, mapError(ctx, err, false, "mysql: inspect key %v", key)
	}
	if !rw.found || !rw.held() && !rw.completed() {
		held, err := s.heldNow(ctx, conn, k)
		switch {
		case err != nil:
			return nil, err
		case held && (!rw.found || rw.progress == nil):
			return &backend.KeyInfo{Key: key, State: backend.KeyInProgress}, nil
		case !rw.found:
			return nil, fmt.Errorf("mysql: inspect key %v: %w", key, idempotency.ErrNotFound)
		case held:
			info, err := rw.info(key)
			if err == nil {
				info.State = backend.KeyInProgress
			}
			return info, err
		}
	}
	info, err := rw.info(key)
	if err == nil && body && rw.state == stateCompleted {
		info.Body = rw.body
	}
	return info, err
}

// heldNow reports whether an open transaction holds k's row (an
// uncommitted one included), with a shared locking read that never waits,
// in a READ COMMITTED transaction on conn.
func (s *Store) heldNow(ctx context.Context, conn *sql.Conn, k key) (bool, error) {
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return false, mapError(ctx, err, false, "mysql: inspect key %v: begin", k.key)
	}
	defer func() { _ = tx.Rollback() }()
	// MariaDB has LOCK IN SHARE MODE NOWAIT and no FOR SHARE; MySQL has
	// FOR SHARE NOWAIT, and no NOWAIT after LOCK IN SHARE MODE. The first
	// syntax error tells which (a failed statement leaves tx open).
	mysqlSyntax := s.shareSyntax.Load()
	q := s.steps.probeShare
	if mysqlSyntax {
		q = s.steps.probeShareMy
	}
	var one int
	err = tx.QueryRowContext(ctx, q, k.scope, k.id).Scan(&one)
	if me := (*gomysql.MySQLError)(nil); errors.As(err, &me) && me.Number == erParse {
		s.shareSyntax.Store(!mysqlSyntax)
		q = s.steps.probeShare
		if !mysqlSyntax {
			q = s.steps.probeShareMy
		}
		err = tx.QueryRowContext(ctx, q, k.scope, k.id).Scan(&one)
	}
	if err == nil || errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err = mapError(ctx, err, true, ""); errors.Is(err, idempotency.ErrInProgress) {
		return true, nil
	}
	return false, fmt.Errorf("mysql: inspect key %v: probe: %w", k.key, err)
}

// Forget implements [backend.KeyAdmin] in one short READ COMMITTED
// transaction: it locks the key's row with SELECT ... FOR UPDATE NOWAIT
// (a row held by an open transaction, or a new key's uncommitted row, is
// refused with [idempotency.ErrInProgress] at once), refuses a row that
// [Store.Inspect] would report [backend.KeyInProgress] (a live lease, or a
// pending row committed without its completion), and deletes the row.
func (s *Store) Forget(ctx context.Context, key idempotency.Key) (*backend.KeyInfo, error) {
	now, err := s.testNow()
	if err != nil {
		return nil, err
	}
	k := keyOf(key)
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, mapError(ctx, err, false, "mysql: forget key %v: begin", key)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	rw, err := scanStep(tx.QueryRowContext(ctx, s.steps.forgetRead, k.scope, k.id), now)
	if err != nil {
		return nil, mapError(ctx, err, true, "mysql: forget key %v", key)
	}
	if !rw.found {
		return nil, fmt.Errorf("mysql: forget key %v: %w", key, idempotency.ErrNotFound)
	}
	info, err := rw.info(key)
	if err != nil {
		return nil, err
	}
	if info.State == backend.KeyInProgress {
		return nil, fmt.Errorf("%w: mysql: forget key %v: held until %v", idempotency.ErrInProgress, key, heldUntil(rw))
	}
	if _, err := tx.ExecContext(ctx, s.steps.forget, k.scope, k.id); err != nil {
		return nil, mapError(ctx, err, false, "mysql: forget key %v", key)
	}
	if err := tx.Commit(); err != nil {
		return nil, mapError(ctx, err, false, "mysql: forget key %v: commit", key)
	}
	return info, nil
}

// heldUntil is when the hold of a held row ends by itself: its lease's
// end, or a committed pending row's expiry.
func heldUntil(rw stepRow) time.Time {
	if rw.progress != nil {
		return time.Unix(0, rw.leaseEnds).UTC()
	}
	return time.Unix(0, rw.expires).UTC()
}

// List implements [backend.KeyLister] with at most two consistent
// reads on the primary key (scope, id): the scope's keys with progress
// (unfinished operations, leased or not), then the others, each in byte
// order of id after the cursor. A key's state is judged from its committed
// row, without probing for open transactions (see [Store.Inspect]): a new
// key held by an open transaction is not listed, and a pending row
// committed without its completion is listed as held among the others.
// q.Limit must be 1 to 1000, else the error wraps
// [idempotency.ErrInvalidConfig].
func (s *Store) List(ctx context.Context, q backend.ListQuery) (backend.KeyPage, error) {
	if err := q.Validate(); err != nil {
		return backend.KeyPage{}, fmt.Errorf("mysql: list: %w", err)
	}
	now, err := s.testNow()
	if err != nil {
		return backend.KeyPage{}, err
	}
	var keys []backend.KeyInfo
	after := ""
	if c := q.After; c != nil {
		after = c.ID
	}
	if q.After == nil || q.After.Unfinished {
		if keys, err = s.listPart(ctx, keys, s.steps.listFirst, q.Scope, after, q.Limit+1, now); err != nil {
			return backend.KeyPage{}, err
		}
		after = ""
	}
	if len(keys) <= q.Limit {
		if keys, err = s.listPart(ctx, keys, s.steps.listRest, q.Scope, after, q.Limit+1-len(keys), now); err != nil {
			return backend.KeyPage{}, err
		}
	}
	var page backend.KeyPage
	if len(keys) > q.Limit {
		keys = keys[:q.Limit]
		last := keys[len(keys)-1]
		page.Next = &backend.ListCursor{Unfinished: last.Progress != nil, ID: last.Key.ID}
	}
	page.Keys = keys
	return page, nil
}

// listPart appends to keys up to limit keys of scope after the id after,
// read by the statement query (listFirst or listRest).
func (s *Store) listPart(ctx context.Context, keys []backend.KeyInfo, query, scope, after string, limit int, now any) ([]backend.KeyInfo, error) {
	rows, err := s.db.QueryContext(ctx, query, []byte(scope), []byte(after), limit)
	if err != nil {
		return nil, mapError(ctx, err, false, "mysql: list keys")
	}
	defer rows.Close()
	for rows.Next() {
		var id []byte
		rw, err := scanStep(rows, now, &id)
		if err != nil {
			return nil, mapError(ctx, err, false, "mysql: list keys")
		}
		info, err := rw.info(idempotency.Key{Scope: scope, ID: string(id)})
		if err != nil {
			return nil, err
		}
		keys = append(keys, *info)
	}
	if err := rows.Err(); err != nil {
		return nil, mapError(ctx, err, false, "mysql: list keys")
	}
	return keys, nil
}

// Stats implements [backend.KeyLister] with one consistent read of
// the whole table (a full scan: for an admin page, not a hot path), by the
// server's clock or [Config.Clock]. A pending row committed without its
// completion counts as Held until it expires, as [Store.Inspect] reports
// it.
func (s *Store) Stats(ctx context.Context) (backend.Stats, error) {
	now, err := s.testNow()
	if err != nil {
		return backend.Stats{}, err
	}
	var (
		st     backend.Stats
		oldest sql.NullInt64
	)
	err = s.db.QueryRowContext(ctx, s.steps.stats, now).Scan(&st.InProgress, &st.Unfinished, &st.Completed, &st.Expired, &st.Failing, &oldest, &st.BodyBytes)
	if err != nil {
		return backend.Stats{}, mapError(ctx, err, false, "mysql: stats")
	}
	if oldest.Valid {
		st.OldestUnfinished = time.Unix(0, oldest.Int64).UTC()
	}
	return st, nil
}
