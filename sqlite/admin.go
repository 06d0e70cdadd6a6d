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

// readWait bounds how long the reads of key administration (Inspect,
// List, Stats, Abandoned) retry SQLITE_BUSY. Outside WAL mode a reader
// meets it while a writer commits (or spills its cache), and a connection
// without busy timeout meets it at once.
const readWait = time.Second

// forgetWait bounds how long [Store.Forget] waits for the Store's write
// turn (held by callers of other keys) and for SQLite's write lock (held
// by a writer outside the Store).
const forgetWait = time.Second

// keyRow is a row of the keys table as infoCols reads it.
type keyRow struct {
	scope, id, fp, state string
	status               int64
	header, body         []byte
	bodyNull             bool
	bodyLen              int64
	created, expires     int64
	progress             []byte
	progressNull         bool
	tries                int64
	leaseEnds            sql.NullInt64
	now                  int64 // the store's clock when the row was read
}

// dest returns the scan destinations of infoCols.
func (r *keyRow) dest() []any {
	return []any{&r.scope, &r.id, &r.fp, &r.state, &r.status, &r.header, &r.body, &r.bodyNull, &r.bodyLen,
		&r.created, &r.expires, &r.progress, &r.progressNull, &r.tries, &r.leaseEnds, &r.now}
}

func (r *keyRow) scan(row *sql.Row) error { return row.Scan(r.dest()...) }

// info builds what the row says of its key, with the body if withBody
// (the row was read with it). mine: the Store's write turn is held for the
// key (an open transaction of Reserve or Acquire).
func (r *keyRow) info(key idempotency.Key, mine, withBody bool) (*backend.KeyInfo, error) {
	info := &backend.KeyInfo{
		Key:         key,
		Fingerprint: r.fp,
		CreatedAt:   time.Unix(0, r.created).UTC(),
		ExpiresAt:   time.Unix(0, r.expires).UTC(),
	}
	if r.leaseEnds.Valid {
		info.LeaseEnds = time.Unix(0, r.leaseEnds.Int64).UTC()
	}
	switch {
	case !r.progressNull:
		info.State = backend.KeyUnfinished
		if mine || r.leaseEnds.Valid && r.leaseEnds.Int64 > r.now {
			info.State = backend.KeyInProgress
		}
		info.Progress, info.Tries = r.progress, int(r.tries)
		if info.Progress == nil {
			info.Progress = []byte{} // an empty BLOB, not NULL
		}
		return info, nil
	case r.state != "completed":
		// Committed pending rows come only from writers outside this
		// package (or from fn committing Tx itself): held until expiry.
		info.State = backend.KeyInProgress
		if r.expires <= r.now {
			info.State = backend.KeyExpired
		}
		return info, nil
	case r.expires <= r.now:
		info.State = backend.KeyExpired
		if mine {
			info.State = backend.KeyInProgress // being taken over
		}
	default:
		info.State = backend.KeyCompleted
	}
	h, err := backend.UnmarshalHeader(r.header)
	if err != nil {
		return nil, fmt.Errorf("sqlite: key %v: stored header: %w", key, err)
	}
	info.Status, info.Header, info.BodyLen = int(r.status), h, int(r.bodyLen)
	if withBody {
		info.Body = r.body
		if info.Body == nil && !r.bodyNull {
			info.Body = []byte{} // an empty BLOB, not NULL
		}
	}
	return info, nil
}

// holds reports whether the Store's write turn is held for key: a
// transaction of Reserve or Acquire of this Store holds it, or is about to.
func (s *Store) holds(key idempotency.Key) bool {
	k := s.turnKey.Load()
	return k != nil && *k == key
}

// Inspect implements [backend.KeyAdmin] with one SELECT outside any
// transaction. In WAL mode it waits for no writer. Outside WAL mode a
// commit in progress makes a read fail with SQLITE_BUSY: Inspect then
// retries for up to a second (waiting for that commit, never for a key's
// holder), then reports [backend.ErrConflict]. The same holds for
// List, Stats and Abandoned. The body is
// read only when body is set. It needs the columns that [Store.Migrate]
// adds to a v0.1.0 table.
//
// What it can tell of a key held in an open transaction: such a
// transaction's writes are invisible to other connections until it
// commits, so Inspect reads the last committed row. A key whose
// transaction is this Store's (Reserve or Acquire through this same Store
// value: it holds the Store's write turn) is reported [backend.KeyInProgress]:
// a new key with its Key alone, an unfinished or expired one with its
// committed row. A key held by a transaction of another Store or process
// is reported as committed: a new key gives an error wrapping
// [idempotency.ErrNotFound], an expired record being taken over
// KeyExpired, and an unfinished key being resumed KeyInProgress only while its
// committed lease is live (else KeyUnfinished).
func (s *Store) Inspect(ctx context.Context, key idempotency.Key, body bool) (*backend.KeyInfo, error) {
	now, err := s.testNow()
	if err != nil {
		return nil, err
	}
	query := s.q.steps.inspect
	if body {
		query = s.q.steps.inspectBody
	}
	var row keyRow
	err = retryBusyFor(ctx, readWait, func() error {
		return row.scan(s.db.QueryRowContext(ctx, query, key.Scope, key.ID, now))
	})
	mine := s.holds(key)
	switch {
	case errors.Is(err, sql.ErrNoRows) && mine:
		return &backend.KeyInfo{Key: key, State: backend.KeyInProgress}, nil
	case errors.Is(err, sql.ErrNoRows):
		return nil, fmt.Errorf("sqlite: inspect key %v: %w", key, idempotency.ErrNotFound)
	case err != nil:
		return nil, mapError(ctx, "inspect", err)
	}
	return row.info(key, mine, body)
}

// Forget implements [backend.KeyAdmin]: it deletes the key's row in a
// transaction of its own, whose one statement is a DELETE that skips a
// held row. It needs the columns that [Store.Migrate] adds to a v0.1.0
// table.
//
// A key that a caller of this Store holds (Reserve or Acquire, in an open
// transaction) is refused at once with [idempotency.ErrInProgress]: the
// Store's write turn says so. So is a key whose committed lease is live.
// Forget never waits for a key's holder. But SQLite has one writer at a
// time, so the DELETE waits for the writers of other keys, up to one
// second in all. The Store's write turn held that long by callers of other
// keys gives [backend.ErrConflict] (the database is busy, the key is
// not held: retry later). SQLite's write lock held that long by a writer
// outside the Store (another Store, another process) gives
// ErrInProgress: that writer may hold the key, and SQLite cannot tell
// without waiting for it. A new key held by such a writer has no committed
// row yet: Forget reports [idempotency.ErrNotFound] without waiting when it
// gets the lock first, or ErrInProgress as above.
func (s *Store) Forget(ctx context.Context, key idempotency.Key) (*backend.KeyInfo, error) {
	now, err := s.testNow()
	if err != nil {
		return nil, err
	}
	st, err := s.statements(ctx)
	if err != nil {
		return nil, err
	}
	var row keyRow
	del := func(ctx context.Context, tx *sql.Tx) (bool, error) {
		err := row.scan(tx.QueryRowContext(ctx, s.q.steps.forget, key.Scope, key.ID, now))
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil // absent or held
		}
		return err == nil, err
	}
	r := backend.Reservation{Key: key, Deadline: time.Now().Add(forgetWait)}
	o, _, err := s.openKey(ctx, st, r, now, false, false, del)
	if o == nil {
		return nil, fmt.Errorf("sqlite: forget: %w", err)
	}
	defer s.releaseTurn()
	if !o.won {
		var held keyRow
		err := held.scan(o.tx.QueryRowContext(ctx, s.q.steps.inspect, key.Scope, key.ID, now))
		o.end()
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return nil, fmt.Errorf("sqlite: forget key %v: %w", key, idempotency.ErrNotFound)
		case err != nil:
			return nil, mapError(ctx, "forget: read key", err)
		}
		return nil, fmt.Errorf("%w: sqlite: forget: key %v is held (lease until %v, expiry %v)", idempotency.ErrInProgress, key,
			time.Unix(0, held.leaseEnds.Int64).UTC(), time.Unix(0, held.expires).UTC())
	}
	if err := o.tx.Commit(); err != nil {
		discard(o.conn)
		o.end()
		return nil, mapError(ctx, "forget: commit", err)
	}
	release(o.conn, o.orig, o.cur)
	return row.info(key, false, false)
}

// List implements [backend.KeyLister] with one SELECT outside any
// transaction (one snapshot): the keys of q.Scope that have progress
// (unfinished, or held by a live lease) by id, then the others by id. Ids
// compare byte by byte. A key held by an open transaction is listed as its
// committed row reads (see [Store.Inspect]); a new key held so is not
// listed. q.Limit must be 1 to 1000, else an error wraps
// [idempotency.ErrInvalidConfig]. Bodies are not read. It needs the
// columns that [Store.Migrate] adds to a v0.1.0 table.
func (s *Store) List(ctx context.Context, q backend.ListQuery) (backend.KeyPage, error) {
	if err := q.Validate(); err != nil {
		return backend.KeyPage{}, fmt.Errorf("sqlite: list: %w", err)
	}
	now, err := s.testNow()
	if err != nil {
		return backend.KeyPage{}, err
	}
	// Ids are never empty: "" is before every id. NULL skips the
	// unfinished keys.
	var afterFirst, afterRest any = "", ""
	if c := q.After; c != nil {
		if c.Unfinished {
			afterFirst = c.ID
		} else {
			afterFirst, afterRest = nil, c.ID
		}
	}
	var (
		page  backend.KeyPage
		parts []bool
	)
	err = retryBusyFor(ctx, readWait, func() error {
		page, parts = backend.KeyPage{}, nil
		rows, err := s.db.QueryContext(ctx, s.q.steps.list, q.Scope, afterFirst, afterRest, q.Limit+1, now)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				part int
				row  keyRow
			)
			if err := rows.Scan(append([]any{&part}, row.dest()...)...); err != nil {
				return err
			}
			key := idempotency.Key{Scope: row.scope, ID: row.id}
			info, err := row.info(key, s.holds(key), false)
			if err != nil {
				return err
			}
			page.Keys = append(page.Keys, *info)
			parts = append(parts, part == 0)
		}
		return rows.Err()
	})
	if err != nil {
		return backend.KeyPage{}, mapError(ctx, "list", err)
	}
	if len(page.Keys) > q.Limit {
		page.Keys = page.Keys[:q.Limit]
		page.Next = &backend.ListCursor{Unfinished: parts[q.Limit-1], ID: page.Keys[q.Limit-1].Key.ID}
	}
	return page, nil
}

// Stats implements [backend.KeyLister] with one SELECT over the whole
// table outside any transaction, by the store's clock (SQLite's, or
// [Config].Clock). Held counts the unfinished keys whose lease is live (and
// pending rows committed by writers outside this package, until their
// expiry); reservations in open transactions are not counted, since their
// rows are not committed. It needs the columns that [Store.Migrate] adds to
// a v0.1.0 table.
func (s *Store) Stats(ctx context.Context) (backend.Stats, error) {
	now, err := s.testNow()
	if err != nil {
		return backend.Stats{}, err
	}
	var (
		st     backend.Stats
		oldest sql.NullInt64
	)
	err = retryBusyFor(ctx, readWait, func() error {
		return s.db.QueryRowContext(ctx, s.q.steps.stats, now).
			Scan(&st.InProgress, &st.Unfinished, &st.Completed, &st.Expired, &st.Failing, &oldest, &st.BodyBytes)
	})
	if err != nil {
		return backend.Stats{}, mapError(ctx, "stats", err)
	}
	if oldest.Valid {
		st.OldestUnfinished = time.Unix(0, oldest.Int64).UTC()
	}
	return st, nil
}
