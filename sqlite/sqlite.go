package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/go-idempotency/idempotency"
)

var _ idempotency.KeyStore[*sql.Tx] = (*Store)(nil)

// DefaultTable is the name of the keys table when [Config.Table] is empty.
const DefaultTable = "idempotency_keys"

// DSNOptions are the DSN query parameters [Open] uses, for callers who open
// the database themselves with sql.Open("sqlite", path+"?"+DSNOptions):
//
//   - journal_mode(WAL): readers never block the writer nor each other, so
//     replays and lookups run while a key is held;
//   - busy_timeout(5000): statements of other writers wait up to 5s for
//     the write lock instead of failing at once with SQLITE_BUSY;
//   - foreign_keys(1): foreign keys are enforced;
//   - _txlock=immediate: every transaction takes the write lock at BEGIN,
//     so a transaction that reads before it writes cannot fail with
//     SQLITE_BUSY when it upgrades its lock.
//
// The synchronous pragma is left at SQLite's default (FULL), so a committed
// key survives a power loss.
const DSNOptions = "_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_txlock=immediate"

// Open opens the SQLite database file at path, creating it if needed, with
// [DSNOptions], and checks that it can be used. path is a plain file path:
// "", ":memory:" (each connection would see its own database), a "file:" URI
// and a path containing '?' are refused with an error wrapping
// [idempotency.ErrInvalidConfig]. The caller closes the returned *sql.DB.
func Open(ctx context.Context, path string) (*sql.DB, error) {
	switch {
	case path == "", path == ":memory:", strings.HasPrefix(path, "file:"), strings.Contains(path, "?"):
		return nil, fmt.Errorf("%w: sqlite: path %q: want a plain file path, not empty, \":memory:\", a file: URI or containing '?'",
			idempotency.ErrInvalidConfig, path)
	}
	db, err := sql.Open("sqlite", path+"?"+DSNOptions)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	return db, nil
}

// Config tunes a [Store]. The zero value (or nil) means the defaults.
type Config struct {
	// Table is the name of the keys table: 1 to 63 ASCII letters, digits
	// and underscores, not starting with a digit nor with "sqlite_".
	// Defaults to [DefaultTable].
	Table string
}

// Store is an [idempotency.KeyStore] on a SQLite database. It is safe for
// concurrent use; build it with [New].
type Store struct {
	db     *sql.DB
	schema string
	q      queries
}

// queries are the statements of one Store, with its table name quoted in.
type queries struct {
	lookup, reserve, read, complete, purge string
}

// New returns a Store keeping its keys in cfg.Table of db. A nil cfg means
// the defaults; a bad table name gives an error wrapping
// [idempotency.ErrInvalidConfig]. New runs no SQL: create the table with
// [Store.Migrate] or with the DDL of [Store.Schema].
//
// db must be opened with the "sqlite" driver of modernc.org/sqlite. [Open]
// gives the recommended settings ([DSNOptions]). A database opened
// otherwise works too, even with no DSN option at all: the Store sets the
// busy timeout of the connection it reserves a key on to the wait bound for
// the time of the reservation, restores it before the caller's statements
// run, and puts the reservation first in the transaction. Without WAL
// journal mode a COMMIT waits for the database's readers, so when the
// connection's busy timeout is below 5s, [idempotency.Txn.Complete] raises
// it to 5s for its UPDATE and COMMIT and restores it afterwards.
func New(db *sql.DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: sqlite: nil *sql.DB", idempotency.ErrInvalidConfig)
	}
	table := DefaultTable
	if cfg != nil && cfg.Table != "" {
		table = cfg.Table
	}
	schema, err := Schema(table)
	if err != nil {
		return nil, err
	}
	t := `"` + table + `"`
	return &Store{
		db:     db,
		schema: schema,
		q: queries{
			// One row always: the connection's busy timeout, and the key
			// when it is completed and live.
			lookup: `SELECT (SELECT timeout FROM pragma_busy_timeout), k.fingerprint, k.status, k.header, k.body, k.body IS NULL, k.created_at, k.expires_at
FROM (SELECT 1) LEFT JOIN ` + t + ` AS k ON k.scope = ?1 AND k.id = ?2 AND k.state = 'completed' AND k.expires_at > ?3`,
			// Inserts the key, or takes over an expired one; changes no
			// row when a live one exists.
			reserve: `INSERT INTO ` + t + ` (scope, id, fingerprint, state, status, header, body, created_at, expires_at)
VALUES (?1, ?2, ?3, 'pending', 0, NULL, NULL, ?4, ?5)
ON CONFLICT (scope, id) DO UPDATE SET fingerprint = excluded.fingerprint, state = 'pending', status = 0,
	header = NULL, body = NULL, created_at = excluded.created_at, expires_at = excluded.expires_at
WHERE ` + t + `.expires_at <= excluded.created_at`,
			read: `SELECT fingerprint, state, status, header, body, body IS NULL, created_at, expires_at FROM ` + t + ` WHERE scope = ?1 AND id = ?2`,
			complete: `UPDATE ` + t + ` SET state = 'completed', status = ?1, header = ?2, body = ?3
WHERE scope = ?4 AND id = ?5 AND state = 'pending'`,
			purge: `DELETE FROM ` + t + ` WHERE rowid IN (SELECT rowid FROM ` + t + ` WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)`,
		},
	}, nil
}

//go:embed schema.sql
var schemaSQL string

// Schema returns the DDL that creates the keys table named table and its
// expiry index, for users' migrations. It is idempotent (IF NOT EXISTS). A
// bad table name gives an error wrapping [idempotency.ErrInvalidConfig].
func Schema(table string) (string, error) {
	if err := validTable(table); err != nil {
		return "", err
	}
	return strings.ReplaceAll(schemaSQL, DefaultTable, table), nil
}

func validTable(name string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: sqlite: table name %q %s", idempotency.ErrInvalidConfig, name, why)
	}
	switch {
	case name == "":
		return bad("is empty")
	case len(name) > 63:
		return bad("is longer than 63 bytes")
	case name[0] >= '0' && name[0] <= '9':
		return bad("starts with a digit")
	case strings.HasPrefix(strings.ToLower(name), "sqlite_"):
		return bad("starts with sqlite_, which SQLite reserves")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return bad("has a character other than ASCII letters, digits and _")
		}
	}
	return nil
}

// Schema returns the DDL of the Store's table: see the package-level
// [Schema].
func (s *Store) Schema() string { return s.schema }

// Migrate creates the Store's table and index if they do not exist. It is
// idempotent.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.schema); err != nil {
		return wrap("migrate", err)
	}
	return nil
}

// Reserve implements [idempotency.KeyStore]. On one connection of the pool,
// it first looks the key up outside any transaction (a completed, live key
// is returned at once); otherwise it begins a transaction whose first
// statement inserts the reservation, waiting for SQLite's write lock up to
// r.Wait (busy_timeout, restored before it returns) and while ctx lives.
func (s *Store) Reserve(ctx context.Context, r idempotency.Reservation) (idempotency.Txn[*sql.Tx], *idempotency.Record, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, nil, wrap("reserve: connection", err)
	}
	rec, busyTimeout, err := s.lookup(ctx, conn, r)
	if err != nil || rec != nil {
		release(conn, busyTimeout, busyTimeout)
		return nil, rec, err
	}
	t, rec, err := s.reserve(ctx, conn, r, busyTimeout)
	if t == nil {
		return nil, rec, err
	}
	return t, nil, nil
}

// lookup returns the key if it is completed and live, and the connection's
// busy timeout in milliseconds. A lookup that finds the database busy (a
// database not in WAL mode, during a commit) is skipped: the reservation
// then waits for the lock properly.
func (s *Store) lookup(ctx context.Context, conn *sql.Conn, r idempotency.Reservation) (*idempotency.Record, int64, error) {
	var (
		busyTimeout      int64
		fp               sql.NullString
		status           sql.NullInt64
		header, body     []byte
		bodyNull         bool
		created, expires sql.NullInt64
	)
	err := conn.QueryRowContext(ctx, s.q.lookup, r.Key.Scope, r.Key.ID, r.Now.UnixNano()).
		Scan(&busyTimeout, &fp, &status, &header, &body, &bodyNull, &created, &expires)
	if err != nil {
		if werr := wrap("reserve: lookup", err); ctx.Err() == nil && errors.Is(werr, idempotency.ErrConflict) {
			err = conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busyTimeout)
			if err == nil {
				return nil, busyTimeout, nil
			}
		}
		return nil, 0, wrap("reserve: lookup", err)
	}
	if !fp.Valid {
		return nil, busyTimeout, nil
	}
	rec, err := record(r.Key, fp.String, status.Int64, header, body, bodyNull, created.Int64, expires.Int64)
	return rec, busyTimeout, err
}

// reserve inserts the reservation in a new transaction on conn, whose busy
// timeout is orig. It owns conn: unless it returns a txn, conn is back in
// the pool when it returns.
func (s *Store) reserve(ctx context.Context, conn *sql.Conn, r idempotency.Reservation, orig int64) (*txn, *idempotency.Record, error) {
	wait := waitMillis(r.Wait)
	start := time.Now()
	if wait != orig {
		if _, err := conn.ExecContext(ctx, pragmaBusyTimeout(wait)); err != nil {
			release(conn, orig, wait)
			return nil, nil, wrap("reserve: set busy_timeout", err)
		}
	}
	// With _txlock=immediate the BEGIN waits for the write lock; otherwise
	// the INSERT, the transaction's first statement, does. Either way no
	// snapshot is read before the lock is taken, so the wait is under
	// busy_timeout and the row read after it is the latest committed one.
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		release(conn, orig, wait)
		return nil, nil, waitErr(ctx, err, start, r.Wait)
	}
	res, err := tx.ExecContext(ctx, s.q.reserve, r.Key.Scope, r.Key.ID, r.Fingerprint, r.Now.UnixNano(), r.ExpiresAt.UnixNano())
	if err != nil {
		rollback(conn, tx)
		release(conn, orig, wait)
		return nil, nil, waitErr(ctx, err, start, r.Wait)
	}
	n, err := res.RowsAffected()
	if err == nil && n == 1 {
		if wait != orig {
			// The wait bound must not apply to the caller's statements.
			if _, err := tx.ExecContext(ctx, pragmaBusyTimeout(orig)); err != nil {
				rollback(conn, tx)
				release(conn, orig, wait)
				return nil, nil, wrap("reserve: restore busy_timeout", err)
			}
		}
		return &txn{conn: conn, tx: tx, complete: s.q.complete, key: r.Key, busyTimeout: orig}, nil, nil
	}
	// A live row was committed by another caller: read it (the write lock
	// is held, so this is the latest commit) and end the transaction.
	var rec *idempotency.Record
	if err == nil {
		rec, err = s.read(ctx, tx, r.Key)
	}
	rollback(conn, tx)
	release(conn, orig, wait)
	if err != nil {
		return nil, nil, err
	}
	return nil, rec, nil
}

func (s *Store) read(ctx context.Context, tx *sql.Tx, key idempotency.Key) (*idempotency.Record, error) {
	var (
		fp, state        string
		status           int64
		header, body     []byte
		bodyNull         bool
		created, expires int64
	)
	err := tx.QueryRowContext(ctx, s.q.read, key.Scope, key.ID).
		Scan(&fp, &state, &status, &header, &body, &bodyNull, &created, &expires)
	if err != nil {
		return nil, wrap("reserve: read live key", err)
	}
	if state != "completed" {
		// Only a writer outside this package can commit a pending row.
		return nil, fmt.Errorf("%w: sqlite: key %q has a committed pending row until %v",
			idempotency.ErrInProgress, key.ID, time.Unix(0, expires).UTC())
	}
	return record(key, fp, status, header, body, bodyNull, created, expires)
}

func record(key idempotency.Key, fp string, status int64, header, body []byte, bodyNull bool, created, expires int64) (*idempotency.Record, error) {
	var h http.Header
	if len(header) > 0 {
		if err := json.Unmarshal(header, &h); err != nil {
			return nil, fmt.Errorf("sqlite: key %q: stored header: %w", key.ID, err)
		}
	}
	if body == nil && !bodyNull {
		body = []byte{}
	}
	return &idempotency.Record{
		Key:         key,
		Fingerprint: fp,
		Status:      int(status),
		Header:      h,
		Body:        body,
		CreatedAt:   time.Unix(0, created).UTC(),
		ExpiresAt:   time.Unix(0, expires).UTC(),
	}, nil
}

// waitErr reports a failed wait for the write lock: ctx's error once ctx is
// done, ErrInProgress when the lock stayed taken past the wait bound, else
// the error as wrap classifies it.
func waitErr(ctx context.Context, err error, start time.Time, wait time.Duration) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("sqlite: reserve: waiting for the write lock: %w", cerr)
	}
	werr := wrap("reserve", err)
	if errors.Is(werr, idempotency.ErrConflict) && time.Since(start) >= wait {
		return fmt.Errorf("%w: sqlite: the write lock stayed taken for %v: %w", idempotency.ErrInProgress, wait, err)
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

// commitWait is the least busy timeout, in milliseconds, that Complete
// gives its UPDATE and COMMIT: without WAL a COMMIT waits for the readers
// of the database to finish, and failing it at once would run fn again.
const commitWait = 5000

// txn is a reservation held in an open transaction on its own connection.
type txn struct {
	conn        *sql.Conn
	tx          *sql.Tx
	complete    string
	key         idempotency.Key
	busyTimeout int64 // the connection's own, in milliseconds
	ended       bool
}

var errEnded = errors.New("sqlite: reservation already completed or rolled back")

// Tx returns the transaction holding the key; the caller's effect runs on it.
func (t *txn) Tx() *sql.Tx { return t.tx }

// Complete stores resp on the key, marks it completed and commits. When
// the connection's busy timeout is below 5s (a DSN without busy_timeout),
// it is raised to 5s for the UPDATE and the COMMIT and restored afterwards.
func (t *txn) Complete(ctx context.Context, resp idempotency.Response) error {
	if t.ended {
		return errEnded
	}
	t.ended = true
	cur := max(t.busyTimeout, commitWait)
	defer release(t.conn, t.busyTimeout, cur)
	if cur != t.busyTimeout {
		if _, err := t.tx.ExecContext(ctx, pragmaBusyTimeout(cur)); err != nil {
			rollback(t.conn, t.tx)
			return wrap("complete: set busy_timeout", err)
		}
	}
	header, err := json.Marshal(resp.Header)
	if err != nil {
		rollback(t.conn, t.tx)
		return fmt.Errorf("sqlite: complete: header: %w", err)
	}
	res, err := t.tx.ExecContext(ctx, t.complete, resp.Status, header, resp.Body, t.key.Scope, t.key.ID)
	if err != nil {
		rollback(t.conn, t.tx)
		return wrap("complete", err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		rollback(t.conn, t.tx)
		return fmt.Errorf("sqlite: complete: the reservation of key %q is gone (%d rows, %v)", t.key.ID, n, err)
	}
	if err := t.tx.Commit(); err != nil {
		// The driver rolls a failed COMMIT back; should it not have, the
		// connection must not return to the pool inside a transaction.
		discard(t.conn)
		return wrap("commit", err)
	}
	return nil
}

// Rollback abandons the transaction and frees the key; it works with a done
// ctx.
func (t *txn) Rollback(context.Context) error {
	if t.ended {
		return errEnded
	}
	t.ended = true
	defer t.conn.Close()
	err := t.tx.Rollback()
	if err == nil || errors.Is(err, sql.ErrTxDone) {
		// ErrTxDone: database/sql already rolled back when ctx ended.
		return nil
	}
	discard(t.conn)
	return wrap("rollback", err)
}

// Purge implements [idempotency.KeyStore]: it deletes at most limit keys
// whose ExpiresAt <= before in one statement (its own transaction). A key
// held by an open transaction is not visible to it. SQLite has one writer
// at a time, so Purge waits for the write lock like any writer, under the
// busy timeout of the pool's connection and ctx; a database still busy then
// gives an error wrapping [idempotency.ErrConflict].
func (s *Store) Purge(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	res, err := s.db.ExecContext(ctx, s.q.purge, before.UnixNano(), limit)
	if err != nil {
		return 0, wrap("purge", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, wrap("purge", err)
	}
	return int(n), nil
}

// wrap is the one place that reads the driver's result codes: SQLITE_BUSY
// and SQLITE_LOCKED (the write lock or a table lock is taken) are retryable
// conflicts; every other error is returned as it is, with op.
func wrap(op string, err error) error {
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return fmt.Errorf("sqlite: %s: %w: %w", op, idempotency.ErrConflict, err)
		}
	}
	return fmt.Errorf("sqlite: %s: %w", op, err)
}
