package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/lookup"
)

var (
	_ idempotency.KeyStore[*sql.Tx] = (*Store)(nil)
	_ backend.Stepper[*sql.Tx]      = (*Store)(nil)
	_ backend.KeyAdmin              = (*Store)(nil)
	_ backend.KeyLister             = (*Store)(nil)
)

// Config tunes a [Store]. The zero value (or nil) means the defaults.
type Config struct {
	// Table is the name of the keys table: 1 to 63 ASCII letters, digits
	// and underscores, not starting with a digit nor with "sqlite_".
	// Defaults to [DefaultTable].
	Table string
	// Lookup says when Reserve reads the key with a plain SELECT before it
	// takes the Store's write turn. With it a replay of a completed key
	// never waits for the write turn nor takes SQLite's write lock; without
	// it a new key saves the read (a read transaction of its own: about
	// 18 µs of CPU). [backend.LookupAlways] always reads first;
	// [backend.LookupNever] does only when the write turn is busy: under
	// any policy a reservation that would wait for writers of other keys
	// reads first, and one that cannot take the write turn or the write
	// lock looks the key up before it returns an error, so a completed key
	// is answered without waiting for them. Defaults to
	// [backend.LookupAdaptive]: the Store reads first while replays are
	// more than a fifth of its recent first tries (see [Store.Reserve]).
	Lookup backend.LookupPolicy
	// Clock is for tests only. When set, the store reads it instead of
	// SQLite's clock wherever it judges or stores a time: a record's
	// expiry, its creation, Purge. It sends the reading with each
	// statement. Nil is the default, and the only setting for several
	// processes on one database. It uses SQLite's own clock
	// (unixepoch('subsec'), milliseconds): the clock of the host that every
	// process on the file shares. No time of the application is ever sent.
	// A test clock must never differ between processes; a reading outside
	// [backend.MinClock] .. [backend.MaxExpiry] is refused with
	// [idempotency.ErrInvalidConfig] before anything is written.
	Clock func() time.Time
}

// nowSQL is SQLite's clock in Unix nanoseconds, whole milliseconds (the
// resolution of its date functions), the same for a whole statement; a
// test clock's reading in parameter ?n replaces it when not NULL.
func nowSQL(n int) string {
	return fmt.Sprintf("COALESCE(?%d, CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000000)", n)
}

// expirySQL is the clock now plus the TTL in parameter ?ttl (nanoseconds),
// clamped to [backend.MaxExpiry] without leaving int64 (SQLite would
// turn an overflowing sum into a REAL).
func expirySQL(now string, ttl int) string {
	return fmt.Sprintf("min(%s, 9223372036854775807 - ?%d) + ?%d", now, ttl, ttl)
}

// Store is an [idempotency.KeyStore] on a SQLite database. It is safe for
// concurrent use; build it with [New].
type Store struct {
	db     *sql.DB
	clock  func() time.Time // Config.Clock: nil for SQLite's
	table  string
	schema string
	q      queries

	prepared atomic.Pointer[stmts] // nil until the first Reserve
	mu       sync.Mutex            // serialises preparing and Close
	closed   bool

	writer chan struct{} // the Store's write turn: a token, capacity 1
	// turnKey is the key of the caller holding the write turn, nil while
	// nobody does: a caller of that key waits for the key, not for a busy
	// database.
	turnKey atomic.Pointer[idempotency.Key]
	// lockWait is when the holder of the write turn began to wait for
	// SQLite's write lock (unix nanoseconds), 0 when it is not waiting.
	lockWait atomic.Int64

	policy backend.LookupPolicy // Config.Lookup
	// firstTries: while recent first tries found completed keys often
	// enough, Reserve looks the key up first.
	firstTries lookup.Tally
}

// replayWeight is how much more a replay that skips the look-up costs than
// a look-up wasted on a new key: it takes the write turn behind every
// writer of the Store, then SQLite's write lock, where the look-up is one
// read. With it the Store looks up while replays are more than a fifth of
// recent first tries.
const replayWeight = 4

// queries are the statements of one Store, with its table name quoted in.
// Those of Reserve, Complete and Purge (purgeV1) name only the columns of
// the v0.1.0 table, so that Do works on a table not yet upgraded; the
// others need the columns of multi-step operations (see [Schema]).
type queries struct {
	lookup, reserve, read, complete, purge, purgeV1 string
	steps                                           stepQueries
}

// stmts are the statements of the hot path, prepared once per Store:
// database/sql prepares each on a connection the first time it runs there
// and reuses it afterwards, also inside transactions (Tx.StmtContext).
type stmts struct {
	lookup, reserve, complete *sql.Stmt
	// claim, save and stepComplete are the phases' claim of a lease, Save
	// and Complete (stepQueries), nil when the table lacks the columns of
	// multi-step operations (not upgraded): a phase then sends them as
	// text, which fails as it should. Prepared, they spare each phase
	// SQLite's parse of the statement, most of a phase's CPU time.
	claim, save, stepComplete *sql.Stmt
	// wal: the database was in WAL journal mode when the statements were
	// prepared. A COMMIT in WAL mode does not wait for readers, so
	// Complete need not know, nor raise, the connection's busy timeout.
	wal bool
	// busy is the busy timeout, in milliseconds, of the connection the
	// statements were prepared with: what a first try assumes every
	// connection has (see Store.reserve).
	busy int64
}

func (st *stmts) close() {
	for _, p := range []*sql.Stmt{st.lookup, st.reserve, st.complete, st.claim, st.save, st.stepComplete} {
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
// otherwise works too, even with no DSN option at all (see "How keys are
// held" in the package documentation). Whether the database is in WAL mode
// is read once, when the statements are prepared.
//
// Use one Store per table and database. The callers of a Store queue for
// the write lock in memory (see [Store.Reserve]). Two Stores on one
// database meet only at SQLite's lock, like any two writers.
func New(db *sql.DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: sqlite: nil *sql.DB", idempotency.ErrInvalidConfig)
	}
	table := DefaultTable
	if cfg != nil && cfg.Table != "" {
		table = cfg.Table
	}
	var (
		clock  func() time.Time
		policy backend.LookupPolicy
	)
	if cfg != nil {
		clock, policy = cfg.Clock, cfg.Lookup
	}
	if err := policy.Validate(); err != nil {
		return nil, fmt.Errorf("sqlite: Config.Lookup: %w", err)
	}
	schema, err := Schema(table)
	if err != nil {
		return nil, err
	}
	t := `"` + table + `"`
	return &Store{
		db:         db,
		clock:      clock,
		table:      table,
		schema:     schema,
		writer:     make(chan struct{}, 1),
		policy:     policy,
		firstTries: lookup.Tally{ReplayWeight: replayWeight},
		q: queries{
			// The key when it is completed and live; no row otherwise.
			lookup: `SELECT fingerprint, status, header, body, body IS NULL, created_at, expires_at FROM ` + t + `
WHERE scope = ?1 AND id = ?2 AND state = 'completed' AND expires_at > ` + nowSQL(3),
			// Inserts the key, or takes over an expired one; changes no
			// row when a live one exists. It and complete report what they
			// did by the count of changed rows, not by RETURNING, which
			// costs SQLite a result row per call (about 7 µs each).
			reserve: `INSERT INTO ` + t + ` (scope, id, fingerprint, state, status, header, body, created_at, expires_at)
VALUES (?1, ?2, ?3, 'pending', 0, NULL, NULL, ` + nowSQL(4) + `, ` + expirySQL(nowSQL(4), 5) + `)
ON CONFLICT (scope, id) DO UPDATE SET fingerprint = excluded.fingerprint, state = 'pending', status = 0,
	header = NULL, body = NULL, created_at = excluded.created_at, expires_at = excluded.expires_at
WHERE ` + t + `.expires_at <= excluded.created_at`,
			read: `SELECT fingerprint, state, status, header, body, body IS NULL, created_at, expires_at FROM ` + t + ` WHERE scope = ?1 AND id = ?2`,
			complete: `UPDATE ` + t + ` SET state = 'completed', status = ?1, header = ?2, body = ?3, expires_at = ` + expirySQL(nowSQL(6), 7) + `
WHERE scope = ?4 AND id = ?5 AND state = 'pending'`,
			// Never an unfinished row (progress set), whose expiry is
			// MaxExpiry anyway.
			purge: `DELETE FROM ` + t + ` WHERE rowid IN (SELECT rowid FROM ` + t + ` WHERE expires_at <= ` + nowSQL(1) + ` AND progress IS NULL ORDER BY expires_at LIMIT ?2)`,
			// purge on a v0.1.0 table, which has no unfinished rows.
			purgeV1: `DELETE FROM ` + t + ` WHERE rowid IN (SELECT rowid FROM ` + t + ` WHERE expires_at <= ` + nowSQL(1) + ` ORDER BY expires_at LIMIT ?2)`,
			steps:   newStepQueries(t),
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
			return nil, mapError(ctx, "prepare", err)
		}
		*p.dst = stmt
	}
	// Here, before any phase holds a connection: preparing takes one of
	// the pool.
	for _, p := range []struct {
		dst   **sql.Stmt
		query string
	}{{&st.claim, s.q.steps.claim}, {&st.save, s.q.steps.save}, {&st.stepComplete, s.q.steps.complete}} {
		if stmt, err := s.db.PrepareContext(ctx, p.query); err == nil {
			*p.dst = stmt
		}
	}
	var mode string
	if err := s.db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		st.close()
		return nil, mapError(ctx, "journal_mode", err)
	}
	st.wal = strings.EqualFold(mode, "wal")
	if err := s.db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&st.busy); err != nil {
		st.close()
		return nil, mapError(ctx, "busy_timeout", err)
	}
	s.prepared.Store(st)
	return st, nil
}

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

// testNow is the clock parameter of the store's statements: nil, which
// makes them read SQLite's clock, or the reading of the test clock
// ([Config.Clock]) in Unix nanoseconds.
func (s *Store) testNow() (any, error) {
	if s.clock == nil {
		return nil, nil
	}
	now := s.clock()
	if err := backend.CheckClock(now); err != nil {
		return nil, fmt.Errorf("sqlite: Config.Clock: %w", err)
	}
	return now.UnixNano(), nil
}
