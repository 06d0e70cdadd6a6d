package mysql

import (
	"database/sql"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/lookup"
)

// DefaultTable is the table [New] uses when [Config.Table] is empty.
const DefaultTable = "idempotency_keys"

// stateCompleted is the state of a completed key's row.
const stateCompleted = "completed"

var (
	_ idempotency.KeyStore[*sql.Tx] = (*Store)(nil)
	_ backend.ConflictClassifier    = (*Store)(nil)
	_ backend.Migrator              = (*Store)(nil)
	_ backend.Stepper[*sql.Tx]      = (*Store)(nil)
	_ backend.KeyAdmin              = (*Store)(nil)
	_ backend.KeyLister             = (*Store)(nil)
)

// Config tunes a [Store]. The zero value (or nil) means the defaults.
type Config struct {
	// Table is the keys table: a name of letters, digits and underscores,
	// not starting with a digit, at most 63 bytes, in the database the
	// pool's DSN names. It is quoted in SQL. Defaults to "idempotency_keys".
	Table string
	// Isolation is the isolation level of the transaction that holds the
	// key and in which fn runs: [sql.LevelReadCommitted],
	// [sql.LevelRepeatableRead] or [sql.LevelSerializable]; other levels are
	// refused. Setting one costs a round trip per new key (SET TRANSACTION
	// before START TRANSACTION). Defaults to [sql.LevelDefault]: the
	// session's level.
	Isolation sql.IsolationLevel
	// Lookup says when [Store.Reserve] looks the key up outside any
	// transaction before reserving it (see "Round trips" in the package
	// documentation). The default, [backend.LookupAdaptive], looks up
	// first while more than about a third of recent first tries were
	// replays, and always for a caller that waited for a held key.
	// [backend.LookupAlways] always
	// does: a replay then always costs one round trip, and a new key one
	// more than without. [backend.LookupNever] never does: it begins
	// the transaction and inserts the key at once. A replay then always
	// costs several round trips and holds a shared lock on the row
	// meanwhile. Every caller arriving while the key is held waits in its
	// INSERT, where a rollback of the holder answers most waiters with
	// deadlocks (retried as [backend.ErrConflict]). No policy ever
	// runs an effect twice.
	Lookup backend.LookupPolicy
	// Clock is for tests only. When set, the store reads it instead of the
	// server's clock wherever it judges or stores a time (a record's
	// expiry, its creation, Purge). It sends the reading with each
	// statement that writes. Nil is the default and the only setting for a
	// service with several instances. It uses the server's own clock
	// (UTC_TIMESTAMP(6), whatever the session's time zone), which every
	// instance shares: no time of the application is ever sent. A test
	// clock must never differ between instances; a reading outside
	// [backend.MinClock] .. [backend.MaxExpiry] is refused with
	// [idempotency.ErrInvalidConfig] before anything is written.
	Clock func() time.Time
}

// nowSQL is the server's clock in Unix nanoseconds (microsecond
// precision), the unit of the table's times: UTC_TIMESTAMP is independent
// of the session's time zone (no DST fold), and constant within one
// statement.
const nowSQL = "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) AS SIGNED) * 1000"

// clockSQL is the clock of a statement: the parameter (a test clock's
// reading) or, when it is NULL, the server's clock.
const clockSQL = "COALESCE(?, " + nowSQL + ")"

// expirySQL is clockSQL plus a TTL, clamped to [backend.MaxExpiry]
// without overflow: LEAST(clock, MaxInt64 - ttl) + ttl, with both taken as
// parameters (see ttlArgs).
const expirySQL = "LEAST(" + clockSQL + ", ?) + ?"

// ttlArgs are the two parameters of expirySQL after its clock: MaxInt64
// minus ttl, and ttl, in nanoseconds.
func ttlArgs(ttl time.Duration) (int64, int64) {
	return math.MaxInt64 - int64(ttl), int64(ttl)
}

// replayWeight weighs a replay in Store.firstTries against a new key: the
// store looks keys up first while replays are more than 1/(1+replayWeight)
// of its recent first tries. On MariaDB 10.11 under 8 goroutines, a replay
// that skipped the look-up cost 130-160 µs more and a look-up wasted on a
// new key 115-125 µs; in a mix of the two the reservation path costs more
// still, and by CPU it costs about twice a wasted look-up. With weight 1,
// half replays sent 79% of them down the reservation path.
// docs/performance.md has the figures.
const replayWeight = 2

// Store is an [idempotency.KeyStore] on a MySQL or MariaDB table (InnoDB).
// It is safe for concurrent use; build it with [New].
type Store struct {
	db        *sql.DB
	table     string // validated
	isolation sql.IsolationLevel
	lookup    backend.LookupPolicy
	clock     func() time.Time // Config.Clock: nil for the server's
	// firstTries: under LookupAdaptive, Reserve looks the key up first
	// while more than a third of recent first tries found a completed key
	// (replayWeight).
	firstTries lookup.Tally
	// acquireFinds: whether recent first acquisitions of a phase (Acquire,
	// not waiting) found the key's row; while they did not, Acquire on
	// MariaDB inserts the row without looking it up first.
	acquireFinds lookup.Tally
	// stepColumns: a look-up of Acquire read the columns of multi-step
	// operations, so the table has them.
	stepColumns atomic.Bool
	schema      string
	// dialect is the server's dialect, found on first use (see dialectOf).
	dialect atomic.Int32
	// noFold makes the store send its own START TRANSACTION and COMMIT
	// even on a pool of Open (the tests cover both).
	noFold bool

	readSQL       string // the key's row (consistent read), no row if absent
	lookupVarSQL  string // the session's lock wait timeout and the key's row, or NULLs
	probeSQL      string
	insertSQL     string
	takeoverSQL   string
	lockedReadSQL string
	completeSQL   string
	purgeSelect   string
	// purgeSelectV1 is purgeSelect on a table of the v0.1.0 schema, which
	// has no progress column (see Store.Migrate).
	purgeSelectV1 string
	// shareSyntax: Inspect's probe takes MySQL's FOR SHARE NOWAIT, not
	// MariaDB's LOCK IN SHARE MODE NOWAIT (see Store.heldNow).
	shareSyntax atomic.Bool
	// steps are the statements of multi-step operations and of the key
	// administration (steps.go, admin.go).
	steps stepSQL
	// beginSQL begins the transaction inside a statement of the store (at
	// the isolation level), completeFoldSQL stores the response and commits
	// in one statement; both are MariaDB compound statements (see foldConn).
	beginSQL        string
	completeFoldSQL string
}

// New returns a Store on db. A nil cfg means the defaults. A bad table name,
// isolation level or look-up policy gives an error wrapping
// [idempotency.ErrInvalidConfig].
// New sends no SQL (see [Store.Migrate]) and cannot see db's DSN: check it
// with [ParseDSN] or open db with [Open].
func New(db *sql.DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: mysql: nil *sql.DB", idempotency.ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	schema, err := Schema(c.Table)
	if err != nil {
		return nil, err
	}
	if err := c.Lookup.Validate(); err != nil {
		return nil, fmt.Errorf("mysql: Config.Lookup: %w", err)
	}
	switch c.Isolation {
	case sql.LevelDefault, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable:
	default:
		return nil, fmt.Errorf("%w: mysql: isolation level %v is not supported", idempotency.ErrInvalidConfig, c.Isolation)
	}
	begin := "START TRANSACTION; "
	switch c.Isolation {
	case sql.LevelReadCommitted:
		begin = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; " + begin
	case sql.LevelRepeatableRead:
		begin = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; " + begin
	case sql.LevelSerializable:
		begin = "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; " + begin
	}
	q := "`" + c.Table + "`"
	completeSQL := `UPDATE ` + q + ` SET state = 'completed', status = ?, header = ?, body = ?, expires_at = ` + expirySQL + `
WHERE scope = ? AND id = ? AND state = 'pending'`
	// Every read also reports the server's clock, by which the store
	// judges the row it read.
	const cols = `fingerprint, state, status, header, body, created_at, expires_at, ` + nowSQL
	return &Store{
		db:         db,
		table:      c.Table,
		isolation:  c.Isolation,
		lookup:     c.Lookup,
		clock:      c.Clock,
		schema:     schema,
		firstTries: lookup.Tally{ReplayWeight: replayWeight},
		readSQL:    `SELECT ` + cols + ` FROM ` + q + ` WHERE scope = ? AND id = ?`,
		lookupVarSQL: `SELECT @@SESSION.innodb_lock_wait_timeout, k.fingerprint, k.state, k.status, k.header, k.body, k.created_at, k.expires_at, ` + nowSQL + `
FROM (SELECT 1 AS one) AS d LEFT JOIN ` + q + ` AS k ON k.scope = ? AND k.id = ?`,
		probeSQL: `SELECT state FROM ` + q + ` WHERE scope = ? AND id = ? FOR UPDATE NOWAIT`,
		insertSQL: `INSERT INTO ` + q + ` (scope, id, fingerprint, state, status, header, body, created_at, expires_at)
VALUES (?, ?, ?, 'pending', 0, NULL, NULL, ` + clockSQL + `, ` + expirySQL + `)`,
		takeoverSQL: `UPDATE ` + q + ` SET fingerprint = ?, state = 'pending', status = 0, header = NULL, body = NULL,
created_at = ` + clockSQL + `, expires_at = ` + expirySQL + ` WHERE scope = ? AND id = ? AND expires_at <= ` + clockSQL,
		lockedReadSQL:   `SELECT ` + cols + ` FROM ` + q + ` WHERE scope = ? AND id = ? LOCK IN SHARE MODE`,
		completeSQL:     completeSQL,
		purgeSelect:     `SELECT scope, id FROM ` + q + ` WHERE expires_at <= ` + clockSQL + ` AND progress IS NULL ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED`,
		purgeSelectV1:   `SELECT scope, id FROM ` + q + ` WHERE expires_at <= ` + clockSQL + ` ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED`,
		steps:           newStepSQL(q),
		beginSQL:        begin,
		completeFoldSQL: foldCommit(completeSQL),
	}, nil
}

// foldBegin is stmt in a transaction that begin (Store.beginSQL) begins,
// in one MariaDB compound statement (see foldConn).
func foldBegin(begin, stmt string) string {
	return "BEGIN NOT ATOMIC " + begin + stmt + "; END"
}

// foldCommit is update (a statement that must change exactly the key's
// row), a check that it did, and COMMIT, in one MariaDB compound statement
// (see foldConn): a row it did not change fails it with pendingGone.
func foldCommit(update string) string {
	return "BEGIN NOT ATOMIC " + update + ";\nIF ROW_COUNT() <> 1 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '" +
		pendingGone + "'; END IF;\nCOMMIT; END"
}

// testNow is the clock parameter of the store's statements: nil, which
// makes them read the server's clock, or the reading of the test clock
// ([Config.Clock]) in Unix nanoseconds.
func (s *Store) testNow() (any, error) {
	if s.clock == nil {
		return nil, nil
	}
	now := s.clock()
	if err := backend.CheckClock(now); err != nil {
		return nil, fmt.Errorf("mysql: Config.Clock: %w", err)
	}
	return now.UnixNano(), nil
}
