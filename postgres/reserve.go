package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// Reserve implements [idempotency.KeyStore]. It acquires one connection
// and, in one round trip, begins the transaction, takes the key's advisory
// lock and reads the key's row (see the package documentation). With r.Wait
// == 0 a lock held by another transaction is reported at once with
// [idempotency.ErrInProgress]. Otherwise Reserve waits for it up to r.Wait,
// or until ctx's deadline if that comes first, and while ctx lives. A live
// completed row is returned and the transaction ended; otherwise the
// transaction holds the key. A plain look-up comes first as
// [Config.Lookup] says: by default while most recent first tries were
// replays.
func (s *Store) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[pgx.Tx], *backend.Record, error) {
	t, rec, err := s.reserve(ctx, r)
	if t == nil {
		return nil, rec, err
	}
	return pgxTxn{t}, nil, nil
}

// reserve is Reserve on either front end.
func (s *Store) reserve(ctx context.Context, r backend.Reservation) (*txn, *backend.Record, error) {
	now, err := s.now()
	if err != nil {
		return nil, nil, err
	}
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	if s.lookingFirst() {
		k, err := scanKey(conn.queryRow(ctx, s.sql.lookup, r.Key.Scope, r.Key.ID, now), r.Key)
		if err != nil || k.rec != nil || k.held {
			conn.abandon(ctx)
			switch {
			case err != nil:
				return nil, nil, s.mapError(ctx, fmt.Errorf("postgres: look up key %v: %w", r.Key, err), false)
			case k.held:
				return nil, nil, fmt.Errorf("postgres: key %v: %w", r.Key, idempotency.ErrInProgress)
			}
			s.firstTries.Add(r.Wait, true)
			return nil, k.rec, nil
		}
	}
	t, rec, err := s.begin(ctx, conn, r, now)
	if t == nil {
		conn.abandon(ctx)
		if rec != nil {
			s.firstTries.Add(r.Wait, true)
		}
		return nil, rec, err
	}
	s.firstTries.Add(r.Wait, false)
	return t, nil, nil
}

// lockAndRead sends BEGIN, the key's advisory lock and one read of the
// key's row (query, with the key's scope and id and the clock now) in one
// round trip, and scans that row with scan. It returns the lock's result
// (the link's began makes the transaction the batch began fn's); what names the call in errors. A
// transaction that reports REPEATABLE READ or SERIALIZABLE switches the
// store to row mode for good. The caller releases conn on an error.
func (s *Store) lockAndRead(ctx context.Context, conn link, r backend.Reservation, now any, query, what string, scan func(pgx.Row) error) (lockResult, error) {
	b := &pgx.Batch{}
	b.BeginTx(s.txOptions)
	s.queueLock(ctx, b, r)
	b.Queue(query, r.Key.Scope, r.Key.ID, now)
	br := conn.send(ctx, b)
	var lk lockResult
	_, err := br.Exec() // BEGIN
	if err == nil {
		lk, err = scanLock(br, r.Wait > 0)
	}
	if err == nil {
		conn.noteBackend(lk.pid)
		err = scan(br.QueryRow())
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return lk, s.mapError(ctx, fmt.Errorf("postgres: %s key %v (wait bound %v): %w", what, r.Key, r.Wait, err), r.Wait > 0)
	}
	if !lk.readCommitted() {
		s.rowMode.Store(true)
	}
	return lk, nil
}

// begin sends BEGIN, the key's advisory lock and the look-up in one round
// trip. It returns the reservation if the transaction holds the key, or the
// key's live record, or an error. The caller releases conn unless a
// reservation is returned.
//
// Under REPEATABLE READ and SERIALIZABLE the look-up would read in the
// transaction, from a snapshot possibly older than the lock. So the first
// transaction that reports such a level switches the store to beginRow
// for good.
func (s *Store) begin(ctx context.Context, conn link, r backend.Reservation, now any) (*txn, *backend.Record, error) {
	if s.rowMode.Load() {
		return s.beginRow(ctx, conn, r, now)
	}
	var k keyRow
	lk, err := s.lockAndRead(ctx, conn, r, now, s.sql.lookup, "reserve", func(row pgx.Row) (err error) {
		k, err = scanKey(row, r.Key)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	switch {
	case k.rec != nil:
		return nil, k.rec, nil
	case !lk.locked || k.held:
		// A committed pending row that has not expired is an unfinished
		// operation's: held, never taken over.
		return nil, nil, fmt.Errorf("postgres: key %v: %w", r.Key, idempotency.ErrInProgress)
	case !lk.readCommitted():
		if err := conn.rollbackNow(ctx); err != nil {
			return nil, nil, s.mapError(ctx, fmt.Errorf("postgres: reserve key %v: %w", r.Key, err), false)
		}
		return s.beginRow(ctx, conn, r, now)
	}
	conn.began()
	return &txn{s: s, l: conn, key: r.Key, fp: r.Fingerprint, now: now, ttl: r.TTL, expired: k.expired}, nil, nil
}

// beginRow reserves the key with its advisory lock and a pending row, for
// REPEATABLE READ and SERIALIZABLE transactions: BEGIN, the lock and the
// INSERT in one round trip, reading nothing in the transaction (so that
// SERIALIZABLE takes no predicate lock that could fail callers of other
// keys). A row committed since the snapshot makes the INSERT fail with a
// serialization failure ([backend.ErrConflict]) instead of letting fn
// run for a key another caller completed. If a committed row is in the
// way, one more round trip ends the transaction and reads it. A live
// completed row is returned. An expired one is taken over, in one more
// round trip. The caller releases conn unless a reservation is returned.
func (s *Store) beginRow(ctx context.Context, conn link, r backend.Reservation, now any) (*txn, *backend.Record, error) {
	stmt := s.sql.insertPending
	for range 2 {
		b := &pgx.Batch{}
		b.BeginTx(s.txOptions)
		s.queueLock(ctx, b, r)
		b.Queue(stmt, r.Key.Scope, r.Key.ID, r.Fingerprint, now, r.TTL, lockTimeout(ctx, r.Wait))
		br := conn.send(ctx, b)
		var (
			lk  lockResult
			row pgtype.TID
		)
		_, err := br.Exec() // BEGIN
		if err == nil {
			lk, err = scanLock(br, r.Wait > 0)
		}
		if err == nil {
			conn.noteBackend(lk.pid)
			if err = br.QueryRow().Scan(&row, nil); errors.Is(err, pgx.ErrNoRows) {
				err = nil
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		switch {
		case err != nil:
			// A lock timeout of the INSERT means a holder of the key only if
			// the key's lock was not ours: holders take the lock first. With
			// the lock ours, it was another wait (such as the table's
			// extension under many inserts): a conflict to retry, not a key
			// in progress.
			held := r.Wait > 0 || !lk.locked
			return nil, nil, s.mapError(ctx, fmt.Errorf("postgres: reserve key %v (wait bound %v): %w", r.Key, r.Wait, err), held)
		case lk.locked && row.Valid:
			conn.began()
			return &txn{s: s, l: conn, key: r.Key, fp: r.Fingerprint, now: now, ttl: r.TTL, row: row}, nil, nil
		case row.Valid: // inserted without the lock: its holder has not written yet
			return nil, nil, fmt.Errorf("postgres: key %v: %w", r.Key, idempotency.ErrInProgress)
		}
		// A committed row is in the way: end the transaction and read the
		// row in a fresh statement, on the same connection, in one round trip.
		var k keyRow
		b = &pgx.Batch{}
		b.Queue("rollback")
		b.Queue(s.sql.lookup, r.Key.Scope, r.Key.ID, now)
		br = conn.send(ctx, b)
		_, err = br.Exec()
		if err == nil {
			k, err = scanKey(br.QueryRow(), r.Key)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		switch {
		case err != nil:
			return nil, nil, s.mapError(ctx, fmt.Errorf("postgres: read key %v: %w", r.Key, err), false)
		case k.rec != nil:
			return nil, k.rec, nil
		case !lk.locked || k.held:
			return nil, nil, fmt.Errorf("postgres: key %v: %w", r.Key, idempotency.ErrInProgress)
		case !k.expired:
			return nil, nil, fmt.Errorf("%w: postgres: key %v changed while it was read", backend.ErrConflict, r.Key)
		}
		stmt = s.sql.takeOver
	}
	return nil, nil, fmt.Errorf("%w: postgres: key %v changed while it was read", backend.ErrConflict, r.Key)
}

// queueLock queues the statement that takes the key's advisory lock: at
// once or not at all when r.Wait is 0, else waiting up to r.Wait.
func (s *Store) queueLock(ctx context.Context, b *pgx.Batch, r backend.Reservation) {
	if r.Wait > 0 {
		b.Queue(s.sql.waitLock, lockID(s.quoted, r.Key), lockTimeout(ctx, r.Wait))
	} else {
		b.Queue(s.sql.tryLock, lockID(s.quoted, r.Key))
	}
}

// lockResult is what the lock statement reports.
type lockResult struct {
	locked    bool
	isolation string // the transaction's isolation level
	pid       uint32 // the server's process id (pg_backend_pid)
}

func (lk lockResult) readCommitted() bool {
	return lk.isolation == "read committed" || lk.isolation == "read uncommitted"
}

// scanLock reads the result of the statement queueLock queued.
func scanLock(br results, waited bool) (lockResult, error) {
	var (
		lk  lockResult
		pid int32
		err error
	)
	if waited {
		err = br.QueryRow().Scan(&lk.locked, &lk.isolation, nil, &pid)
	} else {
		err = br.QueryRow().Scan(&lk.locked, &lk.isolation, &pid)
	}
	lk.pid = uint32(pid)
	return lk, err
}

// lockTimeout renders a wait bound as a lock_timeout: whole milliseconds,
// rounded up, at least 1ms (0 would mean no bound at all). A ctx deadline
// that comes first shortens it, so that the server stops waiting by then
// too and the connection stays usable.
func lockTimeout(ctx context.Context, wait time.Duration) string {
	if deadline, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(deadline))
	}
	ms := (wait + time.Millisecond - 1) / time.Millisecond
	ms = max(ms, 1)
	ms = min(ms, math.MaxInt32)
	return strconv.FormatInt(int64(ms), 10) + "ms"
}

// keyRow is what the look-up found: a live completed record, or an
// expired row, or a held one (a committed pending row that has not
// expired: an unfinished operation's), or none of them for no row.
type keyRow struct {
	rec     *backend.Record
	expired bool
	held    bool
}

// scanKey scans a row of the look-up.
func scanKey(row pgx.Row, key idempotency.Key) (keyRow, error) {
	var (
		fp                 string
		status             *int
		header, body       []byte
		created, expiresAt time.Time
		expired, pending   bool
	)
	err := row.Scan(&fp, &status, &header, &body, &created, &expiresAt, &expired, &pending)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return keyRow{}, nil
	case err != nil:
		return keyRow{}, err
	case expired:
		return keyRow{expired: true}, nil
	case pending:
		return keyRow{held: true}, nil
	case status == nil:
		return keyRow{}, fmt.Errorf("postgres: completed key %v has no status", key)
	}
	h, err := backend.UnmarshalHeader(header)
	if err != nil {
		return keyRow{}, fmt.Errorf("postgres: stored header of key %v: %w", key, err)
	}
	return keyRow{rec: &backend.Record{Key: key, Fingerprint: fp, Status: *status, Header: h, Body: body,
		CreatedAt: created, ExpiresAt: expiresAt}}, nil
}

// abandon ends whatever transaction conn is in and returns conn to the pool
// (which closes it instead if the ROLLBACK fails). It works with a cancelled
// ctx.
func abandon(ctx context.Context, conn *pgxpool.Conn) {
	pg := conn.Conn().PgConn()
	if !pg.IsClosed() && pg.TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		_, _ = conn.Exec(rctx, "rollback")
		cancel()
	}
	release(conn)
}

// release returns conn to the pool, after closing its socket at once if the
// driver gave the connection up (see dropIfBroken).
func release(conn *pgxpool.Conn) {
	dropIfBroken(conn.Conn().PgConn())
	conn.Release()
}

// dropIfBroken closes the socket of a connection the driver gave up on: one
// whose statement's ctx ended, or that failed under a statement. On its
// own, pgx ends such a connection in the background, politely. It sends
// Terminate, then waits up to 15s for the server to close its end before
// it closes the socket. A server that never got the Terminate (its reply
// was lost, the path to it stalls) keeps the session until the socket
// closes. The session keeps the transaction and the key's advisory lock:
// the key would stay held for those 15s after the caller gave up. Once the
// socket is closed, the server ends the session as soon as it reads the
// close, rolling its transaction back and freeing the key. A healthy
// connection is left alone.
func dropIfBroken(pg *pgconn.PgConn) {
	if pg.IsClosed() {
		_ = pg.Conn().Close()
	}
}
