package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
// The synchronous pragma is left at SQLite's default, FULL: every COMMIT
// waits for an fsync of the WAL, so a key that Do has answered survives a
// power loss or an OS crash. Appending "&_pragma=synchronous(NORMAL)" makes
// a commit several times cheaper (no fsync until a checkpoint), but the
// last commits before a power loss can be rolled back. The key and its
// effect are lost together, so the database holds no duplicate; but the
// caller, who most likely never got the response, retries, fn runs again,
// and whatever fn did outside the database (a call to a payment provider)
// is done twice. A crash of the process alone loses nothing in either
// mode.
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

	prepared atomic.Pointer[stmts] // nil until the first Reserve
	mu       sync.Mutex            // serialises preparing and Close
	closed   bool

	held   flights
	writer chan struct{} // the Store's write turn: a token, capacity 1
}

// queries are the statements of one Store, with its table name quoted in.
type queries struct {
	lookup, reserve, read, complete, purge string
}

// stmts are the statements of the hot path, prepared once per Store:
// database/sql prepares each on a connection the first time it runs there
// and reuses it afterwards, also inside transactions (Tx.StmtContext).
type stmts struct {
	lookup, reserve, complete *sql.Stmt
	// wal: the database was in WAL journal mode when the statements were
	// prepared. A COMMIT in WAL mode does not wait for readers, so
	// Complete need not know, nor raise, the connection's busy timeout.
	wal bool
}

func (st *stmts) close() {
	for _, p := range []*sql.Stmt{st.lookup, st.reserve, st.complete} {
		if p != nil {
			_ = p.Close()
		}
	}
}

// New returns a Store keeping its keys in cfg.Table of db. A nil cfg means
// the defaults; a bad table name gives an error wrapping
// [idempotency.ErrInvalidConfig]. New runs no SQL: create the table with
// [Store.Migrate] or with the DDL of [Store.Schema]. The Store prepares its
// statements on db when it first reserves a key; [Store.Close] releases
// them.
//
// db must be opened with the "sqlite" driver of modernc.org/sqlite. [Open]
// gives the recommended settings ([DSNOptions]). A database opened
// otherwise works too, even with no DSN option at all: the reservation is
// the first statement of the transaction, and the wait for the write lock
// is bounded by the wait bound whatever the connection's busy timeout (see
// [Store.Reserve]). Without WAL journal mode a COMMIT waits for the
// database's readers, so when the connection's busy timeout is below 5s,
// [idempotency.Txn.Complete] raises it to 5s for its UPDATE and COMMIT and
// restores it afterwards. Whether the database is in WAL mode is read once,
// when the statements are prepared.
//
// Use one Store per table and database: the callers of a Store queue for
// keys and for the write lock in memory (see [Store.Reserve]); two Stores
// on one database meet only at SQLite's lock, like any two writers.
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
		writer: make(chan struct{}, 1),
		q: queries{
			// The key when it is completed and live; no row otherwise.
			lookup: `SELECT fingerprint, status, header, body, body IS NULL, created_at, expires_at FROM ` + t + `
WHERE scope = ?1 AND id = ?2 AND state = 'completed' AND expires_at > ?3`,
			// Inserts the key, or takes over an expired one; changes no
			// row when a live one exists.
			reserve: `INSERT INTO ` + t + ` (scope, id, fingerprint, state, status, header, body, created_at, expires_at)
VALUES (?1, ?2, ?3, 'pending', 0, NULL, NULL, ?4, ?5)
ON CONFLICT (scope, id) DO UPDATE SET fingerprint = excluded.fingerprint, state = 'pending', status = 0,
	header = NULL, body = NULL, created_at = excluded.created_at, expires_at = excluded.expires_at
WHERE ` + t + `.expires_at <= excluded.created_at`,
			read: `SELECT fingerprint, state, status, header, body, body IS NULL, created_at, expires_at FROM ` + t + ` WHERE scope = ?1 AND id = ?2`,
			complete: `UPDATE ` + t + ` SET state = 'completed', status = ?1, header = ?2, body = ?3, expires_at = ?6
WHERE scope = ?4 AND id = ?5 AND state = 'pending'`,
			purge: `DELETE FROM ` + t + ` WHERE rowid IN (SELECT rowid FROM ` + t + ` WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)`,
		},
	}, nil
}

// statements returns the Store's prepared statements, preparing them on
// the first call (each takes a connection of the pool for a moment: the
// caller must hold none). A failure (the table does not exist yet) is not
// remembered.
func (s *Store) statements(ctx context.Context) (*stmts, error) {
	if st := s.prepared.Load(); st != nil {
		return st, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	if st := s.prepared.Load(); st != nil {
		return st, nil
	}
	st := new(stmts)
	for _, p := range []struct {
		dst   **sql.Stmt
		query string
	}{{&st.lookup, s.q.lookup}, {&st.reserve, s.q.reserve}, {&st.complete, s.q.complete}} {
		stmt, err := s.db.PrepareContext(ctx, p.query)
		if err != nil {
			st.close()
			return nil, wrap("prepare", err)
		}
		*p.dst = stmt
	}
	var mode string
	if err := s.db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		st.close()
		return nil, wrap("journal_mode", err)
	}
	st.wal = strings.EqualFold(mode, "wal")
	s.prepared.Store(st)
	return st, nil
}

var errClosed = errors.New("sqlite: store closed")

// Close releases the statements the Store prepared on its database. It
// does not close the database. Reservations already made can still be
// completed or rolled back; later calls of Reserve fail.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if st := s.prepared.Swap(nil); st != nil {
		st.close()
	}
	return nil
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

// Reserve implements [idempotency.KeyStore].
//
// Callers of one key in one Store go one at a time: while a caller looks
// the key up, reserves it or holds it, the others wait in memory, holding
// no connection, until it is done. A caller that found the key completed,
// or completed it, hands the record over, so that they answer without a
// statement of their own (each gets its own copy). A caller whose r.Wait
// runs out first looks the key up itself: the record if it is completed,
// else an error wrapping [idempotency.ErrInProgress].
//
// The caller whose turn it is looks the key up with one prepared SELECT on
// any connection of the pool, outside any transaction: a completed, live
// key is returned at once. Otherwise it waits for the Store's write turn
// (SQLite has one writer at a time: a caller of another key holding its
// key delays it too; past r.Wait, ErrInProgress), then takes a connection
// and begins a transaction whose first statement inserts the reservation.
// Against writers outside the Store (another Store, another process, plain
// transactions on db) it waits for SQLite's write lock while ctx lives and
// up to what remains of r.Wait, whatever the connection's busy timeout
// (see reserve).
func (s *Store) Reserve(ctx context.Context, r idempotency.Reservation) (idempotency.Txn[*sql.Tx], *idempotency.Record, error) {
	st, err := s.statements(ctx)
	if err != nil {
		return nil, nil, err
	}
	deadline := time.Now().Add(r.Wait)
	for {
		f, mine := s.held.take(r.Key)
		if mine {
			break
		}
		rec, over, err := f.wait(ctx, deadline)
		switch {
		case err != nil:
			return nil, nil, fmt.Errorf("sqlite: reserve: waiting for key %q: %w", r.Key.ID, err)
		case over:
			// The caller ahead may only be looking the key up: look too.
			if rec, err := s.lookup(ctx, st, r); err != nil || rec != nil {
				return nil, rec, err
			}
			return nil, nil, fmt.Errorf("%w: sqlite: key %q is held by another caller past the wait bound %v",
				idempotency.ErrInProgress, r.Key.ID, r.Wait)
		case rec != nil && rec.ExpiresAt.UnixNano() > r.Now.UnixNano():
			return nil, copyRecord(rec), nil
		}
	}
	rec, err := s.lookup(ctx, st, r)
	if err != nil || rec != nil {
		f := s.held.leave(r.Key)
		if rec != nil && f.waiters > 0 {
			f.rec = copyRecord(rec)
		}
		close(f.done)
		return nil, rec, err
	}
	if err := s.acquire(ctx, deadline); err != nil {
		close(s.held.leave(r.Key).done)
		return nil, nil, err
	}
	t, rec, err := s.reserve(ctx, st, r, deadline)
	if t == nil {
		<-s.writer
		close(s.held.leave(r.Key).done)
		return nil, rec, err
	}
	return t, nil, nil
}

// acquire takes the Store's write turn, waiting for it until deadline, or
// for writeTurnWait if that is later (no
// bound if deadline is zero) and while ctx lives. SQLite has one writer at
// a time; the writers of one Store queue for it here, in order, each woken
// as soon as the previous one is done, rather than polling the write lock
// on the busy handler's schedule (1ms growing to 100ms between tries, in no
// order), which gives waits of hundreds of milliseconds under load. Writers
// outside the Store still meet at SQLite's lock.
func (s *Store) acquire(ctx context.Context, deadline time.Time) error {
	select {
	case s.writer <- struct{}{}:
		return nil
	default:
	}
	// The write turn is taken for callers of other keys (the key itself
	// is this caller's: see flights), so running out of time here is a
	// busy database, a conflict to retry, never "key in progress". A
	// caller that may not wait for a held key (wait 0) still waits for the
	// turn, for up to writeTurnWait.
	d := max(time.Until(deadline), writeTurnWait)
	if deadline.IsZero() {
		d = 0
	}
	busy := func() error {
		return fmt.Errorf("%w: sqlite: the database's one writer stayed busy with other keys for %v",
			idempotency.ErrConflict, d)
	}
	var bound <-chan time.Time
	if d > 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		bound = timer.C
	}
	select {
	case s.writer <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sqlite: waiting for the write lock: %w", ctx.Err())
	case <-bound:
		return busy()
	}
}

// copyRecord returns a copy of rec that shares no header map nor body
// bytes with it (nil and empty kept apart).
func copyRecord(rec *idempotency.Record) *idempotency.Record {
	c := *rec
	c.Header = rec.Header.Clone()
	c.Body = bytes.Clone(rec.Body)
	return &c
}

// lookup returns the key if it is completed and live. A lookup that finds
// the database busy (a database not in WAL mode, during a commit) is
// skipped: the reservation then waits for the lock properly.
func (s *Store) lookup(ctx context.Context, st *stmts, r idempotency.Reservation) (*idempotency.Record, error) {
	var (
		fp               string
		status           int64
		header, body     []byte
		bodyNull         bool
		created, expires int64
	)
	err := st.lookup.QueryRowContext(ctx, r.Key.Scope, r.Key.ID, r.Now.UnixNano()).
		Scan(&fp, &status, &header, &body, &bodyNull, &created, &expires)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		werr := wrap("reserve: lookup", err)
		if ctx.Err() == nil && errors.Is(werr, idempotency.ErrConflict) {
			return nil, nil
		}
		return nil, werr
	}
	return record(r.Key, fp, status, header, body, bodyNull, created, expires)
}

// flights are the keys that callers of one Store are looking up, reserving
// or holding. They only order the callers of this Store and spare them
// polls of the write lock and lookups: the table's primary key alone
// decides who gets a key.
type flights struct {
	mu sync.Mutex
	m  map[idempotency.Key]*flight
}

// flight is one caller's turn with a key.
type flight struct {
	done    chan struct{}       // closed when the turn is over
	waiters int                 // callers waiting for done; under flights.mu
	rec     *idempotency.Record // set before done is closed: the completed key, if known; read only
}

// take gives the caller the key's turn (mine), or returns the flight of
// the caller that has it, counting the caller as its waiter.
func (fs *flights) take(key idempotency.Key) (f *flight, mine bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f, ok := fs.m[key]; ok {
		f.waiters++
		return f, false
	}
	if fs.m == nil {
		fs.m = make(map[idempotency.Key]*flight)
	}
	f = &flight{done: make(chan struct{})}
	fs.m[key] = f
	return f, true
}

// leave ends the caller's turn with key and returns its flight: no caller
// joins it any more, and the caller closes its done channel once it has set
// rec.
func (fs *flights) leave(key idempotency.Key) *flight {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.m[key]
	delete(fs.m, key)
	return f
}

// wait waits until f is over (it returns the record f's caller handed
// over, if any), deadline passes (over) or ctx is done (ctx's error).
func (f *flight) wait(ctx context.Context, deadline time.Time) (rec *idempotency.Record, over bool, err error) {
	d := time.Until(deadline)
	if d <= 0 {
		select {
		case <-f.done:
			return f.rec, false, nil
		default:
			return nil, true, nil
		}
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-f.done:
		return f.rec, false, nil
	case <-ctx.Done():
		return nil, false, ctx.Err()
	case <-timer.C:
		return nil, true, nil
	}
}

// reserve takes a connection and inserts the reservation in a new
// transaction on it, waiting for the write lock until deadline. Unless it
// returns a txn, the connection is back in the pool when it returns.
//
// The wait is SQLite's busy handler's, under the connection's busy timeout
// (read first: database/sql may hand out any connection of the pool). As
// long as what remains of the bound is at least that busy timeout, an
// attempt cannot overrun the bound and nothing is changed: after a
// SQLITE_BUSY that took the whole busy timeout, BEGIN is tried again. The
// last attempt (the bound shorter than the busy timeout, r.Wait == 0, or a
// connection without busy timeout) runs with the busy timeout set to what
// remains of the bound, set back before the caller's statements run. (A
// bound by a context instead would change nothing on the connection, but
// modernc.org/sqlite watches a cancellable context with a goroutine and a
// progress handler in every statement of the transaction: 35µs more per
// new key, measured.)
func (s *Store) reserve(ctx context.Context, st *stmts, r idempotency.Reservation, deadline time.Time) (*txn, *idempotency.Record, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, nil, wrap("reserve: connection", err)
	}
	var orig int64
	if err := conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&orig); err != nil {
		_ = conn.Close()
		return nil, nil, wrap("reserve: busy_timeout", err)
	}
	for {
		var wait int64
		if r.Wait > 0 {
			wait = waitMillis(time.Until(deadline))
		}
		// again: the attempt cannot overrun the bound with the connection's
		// own busy timeout.
		again := orig > 0 && wait >= orig
		cur := orig
		if !again && wait != orig {
			cur = wait
			if _, err := conn.ExecContext(ctx, pragmaBusyTimeout(cur)); err != nil {
				release(conn, orig, cur)
				return nil, nil, wrap("reserve: set busy_timeout", err)
			}
		}
		attempt := time.Now()
		tx, won, err := s.begin(ctx, conn, st, r)
		if err != nil {
			if again && ctx.Err() == nil && errors.Is(wrap("reserve", err), idempotency.ErrConflict) &&
				time.Since(attempt) >= time.Duration(orig)*time.Millisecond {
				continue // the busy timeout ran out, the bound has not
			}
			release(conn, orig, cur)
			return nil, nil, waitErr(ctx, err, deadline, r.Wait)
		}
		if !won {
			rec, err := s.readLive(ctx, conn, tx, r.Key)
			release(conn, orig, cur)
			return nil, rec, err
		}
		if cur != orig {
			// The wait bound must not apply to the caller's statements.
			if _, err := tx.ExecContext(ctx, pragmaBusyTimeout(orig)); err != nil {
				rollback(conn, tx)
				release(conn, orig, cur)
				return nil, nil, wrap("reserve: restore busy_timeout", err)
			}
		}
		commit := orig
		if !st.wal {
			commit = max(orig, commitWait)
		}
		return &txn{
			s: s, conn: conn, tx: tx, complete: st.complete,
			key: r.Key, fp: r.Fingerprint, created: r.Now.UnixNano(), expires: r.ExpiresAt.UnixNano(),
			busyTimeout: orig, commitBusyTimeout: commit,
		}, nil, nil
	}
}

// begin begins a transaction on conn under ctx and inserts the
// reservation as its first statement. It returns the transaction and
// whether the key is now held (if not, a live row exists: the caller reads
// it and ends tx), or an error (tx is then rolled back).
//
// With _txlock=immediate the BEGIN waits for the write lock; otherwise the
// INSERT does. Either way no snapshot is read before the lock is taken, so
// the wait is the busy handler's and the row read after it is the latest
// committed one.
func (s *Store) begin(ctx context.Context, conn *sql.Conn, st *stmts, r idempotency.Reservation) (*sql.Tx, bool, error) {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return nil, false, err
	}
	res, err := tx.StmtContext(ctx, st.reserve).ExecContext(ctx, r.Key.Scope, r.Key.ID, r.Fingerprint, r.Now.UnixNano(), r.ExpiresAt.UnixNano())
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil {
		rollback(conn, tx)
		return nil, false, err
	}
	return tx, n == 1, nil
}

// readLive reads the live row that another caller committed (the write
// lock is held, so this is the latest commit) and ends tx.
func (s *Store) readLive(ctx context.Context, conn *sql.Conn, tx *sql.Tx, key idempotency.Key) (*idempotency.Record, error) {
	rec, err := s.read(ctx, tx, key)
	rollback(conn, tx)
	return rec, err
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
	h, err := idempotency.UnmarshalHeader(header)
	if err != nil {
		return nil, fmt.Errorf("sqlite: key %q: stored header: %w", key.ID, err)
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
// done, ErrInProgress when the lock stayed taken up to the wait bound, else
// the error as wrap classifies it (an SQLITE_BUSY before the bound, such as
// a deadlock SQLite refuses to wait for, is a conflict to retry).
func waitErr(ctx context.Context, err error, deadline time.Time, wait time.Duration) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("sqlite: reserve: waiting for the write lock: %w", cerr)
	}
	werr := wrap("reserve", err)
	if wait > 0 && errors.Is(werr, idempotency.ErrConflict) && !time.Now().Add(time.Millisecond).Before(deadline) {
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
// gives its UPDATE and COMMIT outside WAL mode: a COMMIT then waits for the
// readers of the database to finish, and failing it at once would run fn
// again. (In WAL mode a COMMIT waits for nobody.)
const commitWait = 5000

// writeTurnWait is the least time a caller waits for the Store's write
// turn, which callers of other keys hold, before it reports a busy
// database: a caller that may not wait for its own key (NoWait) still waits
// this long for the others, like any writer waits for a lock.
const writeTurnWait = 5 * time.Second

// txn is a reservation held in an open transaction on its own connection.
type txn struct {
	s                 *Store
	conn              *sql.Conn
	tx                *sql.Tx
	complete          *sql.Stmt
	key               idempotency.Key
	fp                string
	created, expires  int64
	busyTimeout       int64 // the connection's own, in milliseconds
	commitBusyTimeout int64 // for the UPDATE and COMMIT: see commitWait
	ended             bool
}

var errEnded = errors.New("sqlite: reservation already completed or rolled back")

// Tx returns the transaction holding the key; the caller's effect runs on it.
func (t *txn) Tx() *sql.Tx { return t.tx }

// end returns the connection to the pool (its busy timeout set back from
// cur) and ends the caller's turn with the key. If resp was committed
// (header is its stored form), the callers of this Store waiting for the key
// get the committed record, decoded from its stored form as a lookup would
// decode it, in a copy of their own (the caller keeps resp).
func (t *txn) end(cur int64, committed bool, resp idempotency.Response, header []byte) {
	release(t.conn, t.busyTimeout, cur)
	<-t.s.writer
	f := t.s.held.leave(t.key)
	if committed && f.waiters > 0 {
		if rec, err := record(t.key, t.fp, int64(resp.Status), header, bytes.Clone(resp.Body), resp.Body == nil, t.created, t.expires); err == nil {
			f.rec = rec
		}
	}
	close(f.done)
}

// Complete stores resp on the key, marks it completed and commits. Outside
// WAL mode, when the connection's busy timeout is below 5s (a DSN without
// busy_timeout), it is raised to 5s for the UPDATE and the COMMIT and
// restored afterwards.
func (t *txn) Complete(ctx context.Context, resp idempotency.Response, expiresAt time.Time) error {
	if t.ended {
		return errEnded
	}
	t.ended = true
	t.expires = expiresAt.UnixNano()
	cur := t.commitBusyTimeout
	header, err := t.completeAndCommit(ctx, resp, cur)
	if err != nil {
		t.end(cur, false, resp, nil)
		return err
	}
	t.end(cur, true, resp, header)
	return nil
}

// completeAndCommit runs Complete's statements with the busy timeout cur
// and returns the stored header; on an error the transaction is over.
func (t *txn) completeAndCommit(ctx context.Context, resp idempotency.Response, cur int64) ([]byte, error) {
	if cur != t.busyTimeout {
		if _, err := t.tx.ExecContext(ctx, pragmaBusyTimeout(cur)); err != nil {
			rollback(t.conn, t.tx)
			return nil, wrap("complete: set busy_timeout", err)
		}
	}
	header := idempotency.MarshalHeader(resp.Header)
	res, err := t.tx.StmtContext(ctx, t.complete).ExecContext(ctx, resp.Status, header, resp.Body, t.key.Scope, t.key.ID, t.expires)
	if err != nil {
		rollback(t.conn, t.tx)
		return nil, wrap("complete", err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		rollback(t.conn, t.tx)
		return nil, fmt.Errorf("sqlite: complete: the reservation of key %q is gone (%d rows, %v)", t.key.ID, n, err)
	}
	if err := t.tx.Commit(); err != nil {
		// The driver rolls a failed COMMIT back; should it not have, the
		// connection must not return to the pool inside a transaction.
		discard(t.conn)
		return nil, wrap("commit", err)
	}
	return header, nil
}

// Rollback abandons the transaction and frees the key; it works with a done
// ctx.
func (t *txn) Rollback(context.Context) error {
	if t.ended {
		return errEnded
	}
	t.ended = true
	defer t.end(t.busyTimeout, false, idempotency.Response{}, nil)
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
// at a time, so Purge queues for the Store's write turn like any of its
// writers (while ctx lives), then for SQLite's lock against writers outside
// the Store, under the busy timeout of the pool's connection and ctx; a
// database still busy then gives an error wrapping
// [idempotency.ErrConflict]. Keys are random, so a batch of n deletions
// touches about n pages of the primary key's index: keep batches small
// ([idempotency.Config.PurgeBatch]) when Do must stay fast during a purge.
func (s *Store) Purge(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	if err := s.acquire(ctx, time.Time{}); err != nil {
		return 0, err
	}
	res, err := s.db.ExecContext(ctx, s.q.purge, before.UnixNano(), limit)
	<-s.writer
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
