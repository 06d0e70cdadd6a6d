package mysql

import (
	"database/sql"
	"fmt"
	"sync/atomic"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/firsttry"
)

// DefaultTable is the table [New] uses when [Config.Table] is empty.
const DefaultTable = "idempotency_keys"

// The states of a key row.
const (
	statePending   = "pending"
	stateCompleted = "completed"
)

var (
	_ idempotency.KeyStore[*sql.Tx]  = (*Store)(nil)
	_ idempotency.ConflictClassifier = (*Store)(nil)
	_ idempotency.Migrator           = (*Store)(nil)
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
	// LookupFirst makes [Store.Reserve] always look the key up outside any
	// transaction before reserving it: a replay then always costs one round
	// trip, and a new key one more than without (see "Round trips" in the
	// package documentation). By default the store looks up first only
	// while most of its recent first tries were replays, and always for a
	// caller that waited for a held key.
	LookupFirst bool
	// SkipLookup makes [Store.Reserve] never look the key up first: it
	// begins the transaction and inserts the key at once. A replay then
	// always costs several round trips (see "Round trips" in the package
	// documentation) and holds a shared lock on the row meanwhile; and
	// every caller arriving while the key is held waits in its INSERT,
	// where a rollback of the holder answers most waiters with deadlocks
	// (retried as [idempotency.ErrConflict]). No setting ever runs an
	// effect twice. Setting both LookupFirst and SkipLookup is an
	// [idempotency.ErrInvalidConfig].
	SkipLookup bool
}

// Store is an [idempotency.KeyStore] on a MySQL or MariaDB table (InnoDB).
// It is safe for concurrent use; build it with [New].
type Store struct {
	db          *sql.DB
	table       string // validated
	isolation   sql.IsolationLevel
	skipLookup  bool
	lookupFirst bool
	// firstTries: unless lookupFirst or skipLookup, Reserve looks the key
	// up first while most recent first tries found a completed key.
	firstTries firsttry.Tally
	schema     string
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
	// beginSQL begins the transaction inside a statement of the store (at
	// the isolation level), completeFoldSQL stores the response and commits
	// in one statement; both are MariaDB compound statements (see foldConn).
	beginSQL        string
	completeFoldSQL string
}

// New returns a Store on db. A nil cfg means the defaults. A bad table name
// or isolation level gives an error wrapping [idempotency.ErrInvalidConfig].
// New sends no SQL (see [Store.Migrate]) and cannot see db's DSN: check it
// with [CheckDSN] or open db with [Open].
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
	if c.LookupFirst && c.SkipLookup {
		return nil, fmt.Errorf("%w: mysql: LookupFirst and SkipLookup are opposite choices; set one at most", idempotency.ErrInvalidConfig)
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
	completeSQL := `UPDATE ` + q + ` SET state = 'completed', status = ?, header = ?, body = ?, expires_at = ?
WHERE scope = ? AND id = ? AND state = 'pending'`
	const cols = `fingerprint, state, status, header, body, created_at, expires_at`
	return &Store{
		db:          db,
		table:       c.Table,
		isolation:   c.Isolation,
		skipLookup:  c.SkipLookup,
		lookupFirst: c.LookupFirst,
		schema:      schema,
		readSQL:     `SELECT ` + cols + ` FROM ` + q + ` WHERE scope = ? AND id = ?`,
		lookupVarSQL: `SELECT @@SESSION.innodb_lock_wait_timeout, k.fingerprint, k.state, k.status, k.header, k.body, k.created_at, k.expires_at
FROM (SELECT 1 AS one) AS d LEFT JOIN ` + q + ` AS k ON k.scope = ? AND k.id = ?`,
		probeSQL: `SELECT state FROM ` + q + ` WHERE scope = ? AND id = ? FOR UPDATE NOWAIT`,
		insertSQL: `INSERT INTO ` + q + ` (scope, id, fingerprint, state, status, header, body, created_at, expires_at)
VALUES (?, ?, ?, 'pending', 0, NULL, NULL, ?, ?)`,
		takeoverSQL: `UPDATE ` + q + ` SET fingerprint = ?, state = 'pending', status = 0, header = NULL, body = NULL,
created_at = ?, expires_at = ? WHERE scope = ? AND id = ? AND expires_at <= ?`,
		lockedReadSQL:   `SELECT ` + cols + ` FROM ` + q + ` WHERE scope = ? AND id = ? LOCK IN SHARE MODE`,
		completeSQL:     completeSQL,
		purgeSelect:     `SELECT scope, id FROM ` + q + ` WHERE expires_at <= ? ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED`,
		beginSQL:        begin,
		completeFoldSQL: "BEGIN NOT ATOMIC " + completeSQL + ";\nIF ROW_COUNT() <> 1 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '" + pendingGone + "'; END IF;\nCOMMIT; END",
	}, nil
}
