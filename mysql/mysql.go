package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
)

// DefaultTable is the table [New] uses when [Config.Table] is empty.
const DefaultTable = "idempotency_keys"

// maxTableLen is the longest table name [New] accepts (MySQL allows 64).
const maxTableLen = 63

// maxLockWait is the largest innodb_lock_wait_timeout, in seconds.
const maxLockWait = 1073741824

// The states of a key row.
const (
	statePending   = "pending"
	stateCompleted = "completed"
)

var (
	_ idempotency.KeyStore[*sql.Tx]  = (*Store)(nil)
	_ idempotency.ConflictClassifier = (*Store)(nil)
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
	// SkipLookup makes [Store.Reserve] begin the transaction and insert the
	// key at once, without first looking it up outside any transaction. A
	// new key then costs one round trip less; a replay costs three more
	// (START TRANSACTION, the INSERT that meets the completed row, a locking
	// read of it and ROLLBACK, instead of one SELECT) and holds a shared
	// lock on the row meanwhile; and every caller arriving while the key is
	// held waits in its INSERT, where a rollback of the holder answers most
	// waiters with deadlocks (retried as [idempotency.ErrConflict]). No
	// setting ever runs an effect twice. Defaults to false: look up first,
	// so that a replay costs one round trip and opens no transaction.
	SkipLookup bool
}

// Store is an [idempotency.KeyStore] on a MySQL or MariaDB table (InnoDB).
// It is safe for concurrent use; build it with [New].
type Store struct {
	db         *sql.DB
	table      string // validated
	isolation  sql.IsolationLevel
	skipLookup bool
	schema     string

	readSQL       string // the key's row (consistent read), no row if absent
	lookupVarSQL  string // the session's lock wait timeout and the key's row, or NULLs
	probeSQL      string
	insertSQL     string
	takeoverSQL   string
	lockedReadSQL string
	completeSQL   string
	purgeSelect   string
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
	switch c.Isolation {
	case sql.LevelDefault, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable:
	default:
		return nil, fmt.Errorf("%w: mysql: isolation level %v is not supported", idempotency.ErrInvalidConfig, c.Isolation)
	}
	q := "`" + c.Table + "`"
	const cols = `fingerprint, state, status, header, body, created_at, expires_at`
	return &Store{
		db:         db,
		table:      c.Table,
		isolation:  c.Isolation,
		skipLookup: c.SkipLookup,
		schema:     schema,
		readSQL:    `SELECT ` + cols + ` FROM ` + q + ` WHERE scope = ? AND id = ?`,
		lookupVarSQL: `SELECT @@SESSION.innodb_lock_wait_timeout, k.fingerprint, k.state, k.status, k.header, k.body, k.created_at, k.expires_at
FROM (SELECT 1 AS one) AS d LEFT JOIN ` + q + ` AS k ON k.scope = ? AND k.id = ?`,
		probeSQL: `SELECT state FROM ` + q + ` WHERE scope = ? AND id = ? FOR UPDATE NOWAIT`,
		insertSQL: `INSERT INTO ` + q + ` (scope, id, fingerprint, state, status, header, body, created_at, expires_at)
VALUES (?, ?, ?, 'pending', 0, NULL, NULL, ?, ?)`,
		takeoverSQL: `UPDATE ` + q + ` SET fingerprint = ?, state = 'pending', status = 0, header = NULL, body = NULL,
created_at = ?, expires_at = ? WHERE scope = ? AND id = ? AND expires_at <= ?`,
		lockedReadSQL: `SELECT ` + cols + ` FROM ` + q + ` WHERE scope = ? AND id = ? LOCK IN SHARE MODE`,
		completeSQL: `UPDATE ` + q + ` SET state = 'completed', status = ?, header = ?, body = ?, expires_at = ?
WHERE scope = ? AND id = ? AND state = 'pending'`,
		purgeSelect: `SELECT scope, id FROM ` + q + ` WHERE expires_at <= ? ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED`,
	}, nil
}

// Schema returns the DDL of the keys table named table (see [Config.Table]),
// for users' migrations: one CREATE TABLE IF NOT EXISTS statement, with the
// index on expires_at that [Store.Purge] uses, safe to run again.
//
// Keys are VARBINARY, so they compare byte for byte ("abc", "ABC" and
// "abc " are three keys). Times are BIGINT Unix nanoseconds, so neither the
// DSN's parseTime and loc nor the server's time zone matter.
func Schema(table string) (string, error) {
	if err := checkTable(table); err != nil {
		return "", err
	}
	return "CREATE TABLE IF NOT EXISTS `" + table + "` (\n" +
		"  scope       VARBINARY(255) NOT NULL,\n" +
		"  id          VARBINARY(255) NOT NULL,\n" +
		"  fingerprint VARBINARY(255) NOT NULL,\n" +
		"  state       VARCHAR(9) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,\n" +
		"  status      INT NOT NULL DEFAULT 0,\n" +
		"  header      LONGBLOB NULL,\n" +
		"  body        LONGBLOB NULL,\n" +
		"  created_at  BIGINT NOT NULL COMMENT 'Unix nanoseconds',\n" +
		"  expires_at  BIGINT NOT NULL COMMENT 'Unix nanoseconds',\n" +
		"  PRIMARY KEY (scope, id),\n" +
		"  KEY expires_at_idx (expires_at)\n" +
		") ENGINE=InnoDB", nil
}

func checkTable(table string) error {
	ok := table != "" && len(table) <= maxTableLen && (table[0] < '0' || table[0] > '9')
	for i := 0; ok && i < len(table); i++ {
		c := table[i]
		ok = c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
	}
	if !ok {
		return fmt.Errorf("%w: mysql: table name %q: want letters, digits and underscores, not starting with a digit, at most %d bytes",
			idempotency.ErrInvalidConfig, table, maxTableLen)
	}
	return nil
}

// Schema returns the DDL of s's table; see the package-level [Schema].
func (s *Store) Schema() string { return s.schema }

// Migrate creates s's table and its index if they do not exist. It is
// idempotent and safe to run from several processes at once.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.schema); err != nil {
		return fmt.Errorf("mysql: migrate %s: %w", s.table, err)
	}
	return nil
}

// Reserve implements [idempotency.KeyStore], on one connection:
//
//  1. Unless [Config.SkipLookup], it looks the key up outside any
//     transaction, with a consistent read that also reads the session's
//     innodb_lock_wait_timeout; a completed, live key costs that one round
//     trip.
//  2. r.Wait == 0: the row is probed with FOR UPDATE NOWAIT, and a held
//     key is reported at once.
//  3. It begins the transaction fn will use and inserts the key row (or
//     takes over an expired one). A key held by another open transaction
//     makes that statement wait on the primary key, bounded by an
//     innodb_lock_wait_timeout of the wait bound, rounded up to whole
//     seconds (at least 1), set on the session before START TRANSACTION
//     (unless the session has it already) and restored before fn runs.
//
// The statements are the same on every server: MySQL 8.0 and later and
// MariaDB 10.6 and later accept them all.
func (s *Store) Reserve(ctx context.Context, r idempotency.Reservation) (idempotency.Txn[*sql.Tx], *idempotency.Record, error) {
	now, exp := nanos(r.Now), nanos(r.ExpiresAt)
	if exp <= now {
		return nil, nil, fmt.Errorf("mysql: key %q: reservation expires at %v, not after now %v", r.Key.ID, r.ExpiresAt, r.Now)
	}
	k := keyOf(r.Key)
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, nil, wrapErr(ctx, err, "mysql: connection for key %q", r.Key.ID)
	}
	// lockWait is the session's innodb_lock_wait_timeout when the lookup
	// read it, else -1.
	lockWait, rw := int64(-1), row{}
	if !s.skipLookup {
		lockWait, rw, err = s.lookup(ctx, conn, k)
		if err != nil {
			release(ctx, conn, nil, "")
			return nil, nil, wrapErr(ctx, err, "mysql: look up key %q", r.Key.ID)
		}
		if rw.live(now) && rw.state == stateCompleted {
			release(ctx, conn, nil, "")
			rec, err := rw.record(r.Key)
			return nil, rec, err
		}
	}
	if r.Wait == 0 {
		if rec, err := s.probe(ctx, conn, k, now); rec != nil || err != nil {
			release(ctx, conn, nil, "")
			return nil, rec, err
		}
	}

	restore := ""
	if want := lockWaitSeconds(r.Wait); lockWait != want {
		// innodb_lock_wait_timeout cannot be set for one statement in SQL
		// that MySQL accepts: set it on the session for the reservation and
		// restore it before fn runs.
		set, undo := setLockWaitSQL(want), setLockWaitSQL(lockWait)
		if lockWait < 0 { // not read: save it in the session
			set, undo = saveAndSetLockWaitSQL(want), restoreSavedLockWaitSQL
		}
		if _, err := conn.ExecContext(ctx, set); err != nil {
			release(ctx, conn, nil, "")
			return nil, nil, wrapErr(ctx, err, "mysql: set innodb_lock_wait_timeout")
		}
		restore = undo
	}
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: s.isolation})
	if err != nil {
		release(ctx, conn, nil, restore)
		return nil, nil, wrapErr(ctx, err, "mysql: begin for key %q", r.Key.ID)
	}
	won, rec, err := s.claim(ctx, tx, k, r, rw.found && !rw.live(now), now, exp)
	if err != nil || !won {
		release(ctx, conn, tx, restore)
		return nil, rec, wrapErr(ctx, err, "mysql: reserve key %q (wait bound %v)", r.Key.ID, r.Wait)
	}
	if restore != "" {
		// fn's statements keep the session's own lock wait timeout.
		if _, err := tx.ExecContext(ctx, restore); err != nil {
			_ = tx.Rollback()
			discard(conn)
			return nil, nil, wrapErr(ctx, err, "mysql: restore innodb_lock_wait_timeout")
		}
	}
	return &txn{s: s, conn: conn, tx: tx, key: k}, nil, nil
}

// claim takes the key in tx: it takes over the expired row the lookup saw,
// or inserts the row. When the insert meets a committed row it reads that
// row with a locking read (which, unlike a consistent read, sees the latest
// committed version under every isolation level) and either takes it over
// (expired) or returns it (completed).
func (s *Store) claim(ctx context.Context, tx *sql.Tx, k key, r idempotency.Reservation, sawExpired bool, now, exp int64) (bool, *idempotency.Record, error) {
	fp := []byte(r.Fingerprint)
	if sawExpired {
		// Waits, bounded, if another caller is taking the row over.
		n, err := takeOver(ctx, tx, s.takeoverSQL, k, fp, now, exp)
		if err != nil {
			return false, nil, mapError(err, true)
		}
		if n == 1 {
			return true, nil, nil
		}
		// Taken over and completed, or purged, meanwhile: insert.
	}
	_, err := tx.ExecContext(ctx, s.insertSQL, k.scope, k.id, fp, now, exp)
	if err == nil {
		return true, nil, nil
	}
	if err = mapError(err, true); !errors.Is(err, errDuplicate) {
		return false, nil, err
	}
	// The duplicate-key error left a shared lock on the committed row: it
	// cannot change until this transaction ends.
	rw, err := scanRow(tx.QueryRowContext(ctx, s.lockedReadSQL, k.scope, k.id))
	switch {
	case err != nil:
		return false, nil, mapError(err, false)
	case !rw.found:
		return false, nil, fmt.Errorf("%w: the row of key %q vanished while it was read", idempotency.ErrConflict, r.Key.ID)
	case !rw.live(now):
		// Another reader holding a shared lock on the row makes this upgrade
		// a deadlock or a wait: both are conflicts worth a retry.
		n, err := takeOver(ctx, tx, s.takeoverSQL, k, fp, now, exp)
		if err != nil {
			return false, nil, mapError(err, false)
		}
		if n != 1 {
			return false, nil, fmt.Errorf("%w: the expired row of key %q changed while it was taken over", idempotency.ErrConflict, r.Key.ID)
		}
		return true, nil, nil
	case rw.state == stateCompleted:
		rec, err := rw.record(r.Key)
		return false, rec, err
	}
	return false, nil, fmt.Errorf("%w: key %q is pending in a committed row (a transaction committed its reservation without completing it) until %v",
		idempotency.ErrInProgress, r.Key.ID, time.Unix(0, rw.expires).UTC())
}

// takeOver resets k's expired row to a pending reservation with
// fingerprint fp, with the statement query (see Store.takeoverSQL), and
// reports how many rows it changed. The value is the same with or without
// the DSN's clientFoundRows, because expires_at always changes.
func takeOver(ctx context.Context, tx *sql.Tx, query string, k key, fp []byte, now, exp int64) (int64, error) {
	res, err := tx.ExecContext(ctx, query, fp, now, exp, k.scope, k.id, now)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// probe serves r.Wait == 0: a locking read that
// refuses to wait, in autocommit mode (its lock ends with the statement),
// tells whether an open transaction holds the row. A held row is read
// again, because a reader of a key completed just now may hold it for a
// moment: that key is returned, any other gives ErrInProgress. (nil, nil)
// means not held.
func (s *Store) probe(ctx context.Context, conn *sql.Conn, k key, now int64) (*idempotency.Record, error) {
	var state string
	err := conn.QueryRowContext(ctx, s.probeSQL, k.scope, k.id).Scan(&state)
	if err == nil || errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err = mapError(err, true); !errors.Is(err, idempotency.ErrInProgress) {
		return nil, wrapErr(ctx, err, "mysql: probe key %q", k.key.ID)
	}
	rw, rerr := scanRow(conn.QueryRowContext(ctx, s.readSQL, k.scope, k.id))
	if rerr != nil {
		return nil, wrapErr(ctx, rerr, "mysql: look up key %q", k.key.ID)
	}
	if rw.live(now) && rw.state == stateCompleted {
		return rw.record(k.key)
	}
	return nil, fmt.Errorf("mysql: key %q (no wait): %w", k.key.ID, err)
}

// lookup reads the key's row outside any transaction, with a consistent
// read that also reads the session's innodb_lock_wait_timeout, which
// Reserve changes and restores.
func (s *Store) lookup(ctx context.Context, conn *sql.Conn, k key) (int64, row, error) {
	var (
		lockWait int64
		rw       row
		state    sql.NullString
		status   sql.NullInt64
		created  sql.NullInt64
		expires  sql.NullInt64
	)
	err := conn.QueryRowContext(ctx, s.lookupVarSQL, k.scope, k.id).Scan(
		&lockWait, &rw.fingerprint, &state, &status, &rw.header, &rw.body, &created, &expires)
	if err != nil {
		return 0, row{}, err
	}
	rw.found = expires.Valid
	rw.state, rw.status, rw.created, rw.expires = state.String, int(status.Int64), created.Int64, expires.Int64
	return lockWait, rw, nil
}

// key is a key with its scope and id as the []byte arguments the
// statements take (so that the driver sends them as binary strings).
type key struct {
	key       idempotency.Key
	scope, id []byte
}

func keyOf(k idempotency.Key) key {
	return key{key: k, scope: []byte(k.Scope), id: []byte(k.ID)}
}

// row is a key row as read from the table.
type row struct {
	found            bool
	fingerprint      []byte
	state            string
	status           int
	header, body     []byte
	created, expires int64
}

func scanRow(sc interface{ Scan(...any) error }) (row, error) {
	rw := row{found: true}
	err := sc.Scan(&rw.fingerprint, &rw.state, &rw.status, &rw.header, &rw.body, &rw.created, &rw.expires)
	if errors.Is(err, sql.ErrNoRows) {
		return row{}, nil
	}
	return rw, err
}

// live reports whether the row exists and has not expired at now.
func (rw row) live(now int64) bool { return rw.found && rw.expires > now }

func (rw row) record(k idempotency.Key) (*idempotency.Record, error) {
	h, err := idempotency.UnmarshalHeader(rw.header)
	if err != nil {
		return nil, fmt.Errorf("mysql: key %q: stored header: %w", k.ID, err)
	}
	return &idempotency.Record{
		Key:         k,
		Fingerprint: string(rw.fingerprint),
		Status:      rw.status,
		Header:      h,
		Body:        rw.body,
		CreatedAt:   time.Unix(0, rw.created).UTC(),
		ExpiresAt:   time.Unix(0, rw.expires).UTC(),
	}, nil
}

// Purge implements [idempotency.KeyStore]: in one READ COMMITTED
// transaction it locks up to limit expired rows with FOR UPDATE SKIP LOCKED
// (rows held by open transactions are skipped, never waited for), deletes
// them by primary key, purgeChunk rows per statement, and commits.
func (s *Store) Purge(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	b := nanos(before)
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, wrapErr(ctx, err, "mysql: purge %s", s.table)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	rows, err := tx.QueryContext(ctx, s.purgeSelect, b, limit)
	if err != nil {
		return 0, wrapErr(ctx, err, "mysql: purge %s", s.table)
	}
	var keys [][2][]byte
	for rows.Next() {
		var k [2][]byte
		if err := rows.Scan(&k[0], &k[1]); err != nil {
			_ = rows.Close()
			return 0, wrapErr(ctx, err, "mysql: purge %s", s.table)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return 0, wrapErr(ctx, err, "mysql: purge %s", s.table)
	}
	deleted := 0
	var q []byte
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), purgeChunk)]
		keys = keys[len(chunk):]
		q = s.appendPurgeDelete(q[:0], chunk)
		res, err := tx.ExecContext(ctx, string(q))
		if err != nil {
			return 0, wrapErr(ctx, err, "mysql: purge %s", s.table)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, wrapErr(ctx, err, "mysql: purge %s", s.table)
		}
		deleted += int(n)
	}
	if deleted == 0 {
		return 0, nil // nothing to commit: the deferred rollback ends tx
	}
	if err := tx.Commit(); err != nil {
		return 0, wrapErr(ctx, err, "mysql: purge %s: commit", s.table)
	}
	return deleted, nil
}

// purgeChunk is how many rows one DELETE of Purge names: at most about
// 1 KiB of SQL each (two hex-encoded keys of up to 255 bytes), so that a
// statement stays far below max_allowed_packet (4 MiB at the least).
const purgeChunk = 250

// appendPurgeDelete appends to q a DELETE of exactly the rows keys (which
// the transaction has locked already), with the keys as hex literals. The
// keys form a derived table joined first (STRAIGHT_JOIN) to the keys table
// through its primary key (FORCE INDEX): each row is found by one unique
// lookup, so the statement never reads, locks or waits for another row. (A
// WHERE naming the keys lets the optimizer scan a small table, or all the
// rows of one scope, and wait for rows that open transactions hold.)
func (s *Store) appendPurgeDelete(q []byte, keys [][2][]byte) []byte {
	q = append(q, "DELETE k FROM ("...)
	for i, k := range keys {
		if i == 0 {
			q = append(q, "SELECT "...)
		} else {
			q = append(q, " UNION ALL SELECT "...)
		}
		q = appendHex(q, k[0])
		if i == 0 {
			q = append(q, " AS scope"...)
		}
		q = append(q, ", "...)
		q = appendHex(q, k[1])
		if i == 0 {
			q = append(q, " AS id"...)
		}
	}
	q = append(q, ") AS d STRAIGHT_JOIN `"...)
	q = append(q, s.table...)
	return append(q, "` AS k FORCE INDEX (PRIMARY) ON k.scope = d.scope AND k.id = d.id"...)
}

// appendHex appends b as a hexadecimal literal, a binary string: X'...'.
func appendHex(q, b []byte) []byte {
	q = append(q, "X'"...)
	q = hex.AppendEncode(q, b)
	return append(q, '\'')
}

// lockWaitSeconds maps a wait bound to innodb_lock_wait_timeout: whole
// seconds, rounded up, at least 1 (MySQL's minimum), at most its maximum.
func lockWaitSeconds(wait time.Duration) int64 {
	s := int64(wait / time.Second)
	if wait%time.Second != 0 {
		s++
	}
	return min(max(s, 1), maxLockWait)
}

func setLockWaitSQL(seconds int64) string {
	return "SET SESSION innodb_lock_wait_timeout = " + strconv.FormatInt(seconds, 10)
}

// saveAndSetLockWaitSQL saves the session's innodb_lock_wait_timeout in a
// user variable and sets it to seconds; restoreSavedLockWaitSQL restores it
// and clears the variable; each is right whether the server evaluates the
// values of a SET one by one or all before assigning any.
func saveAndSetLockWaitSQL(seconds int64) string {
	return "SET @idempotency_lock_wait = @@SESSION.innodb_lock_wait_timeout, SESSION innodb_lock_wait_timeout = " + strconv.FormatInt(seconds, 10)
}

const restoreSavedLockWaitSQL = "SET SESSION innodb_lock_wait_timeout = @idempotency_lock_wait, @idempotency_lock_wait = NULL"

// nanos is t in Unix nanoseconds, clamped to int64 (years 1678 to 2262).
func nanos(t time.Time) int64 {
	switch {
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	case t.Before(time.Unix(0, math.MinInt64)):
		return math.MinInt64
	}
	return t.UnixNano()
}

// release ends a Reserve that holds no reservation: it rolls tx back (if
// any), restores the lock wait timeout (if changed) and returns conn to the
// pool, or closes it when its session state is unknown.
func release(ctx context.Context, conn *sql.Conn, tx *sql.Tx, restore string) {
	if tx != nil {
		if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
			discard(conn)
			return
		}
	}
	if restore != "" {
		if ctx.Err() != nil {
			discard(conn)
			return
		}
		if _, err := conn.ExecContext(ctx, restore); err != nil {
			discard(conn)
			return
		}
	}
	_ = conn.Close()
}

// discard closes conn's driver connection instead of returning it to the
// pool.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// errDuplicate marks a duplicate-key error (1062) from mapError.
var errDuplicate = errors.New("mysql: duplicate key")

// MySQL and MariaDB error numbers that mapError translates.
const (
	erDupEntry        = 1062 // ER_DUP_ENTRY
	erLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT; MariaDB's NOWAIT too
	erLockDeadlock    = 1213 // ER_LOCK_DEADLOCK
	erCheckRead       = 1020 // ER_CHECKREAD: MariaDB's innodb_snapshot_isolation
	erLockNowait      = 3572 // ER_LOCK_NOWAIT: MySQL's NOWAIT
)

// IsConflict implements [idempotency.ConflictClassifier]: a deadlock
// (1213), a lock wait timeout (1205) or a snapshot conflict (1020) met by
// one of fn's own statements makes [idempotency.Guard.Do] roll back and run
// the attempt again.
func (s *Store) IsConflict(err error) bool {
	var me *gomysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case erLockDeadlock, erLockWaitTimeout, erCheckRead:
		return true
	}
	return false
}

// mapError translates the driver's error codes. waiting says that the
// statement waited for a key under the reservation's lock wait bound: a
// lock wait timeout (or a NOWAIT refusal) then means that another caller
// still holds the key ([idempotency.ErrInProgress]); at any other time it is
// a retryable conflict, like a deadlock.
func mapError(err error, waiting bool) error {
	var me *gomysql.MySQLError
	if !errors.As(err, &me) || errors.Is(err, errDuplicate) ||
		errors.Is(err, idempotency.ErrConflict) || errors.Is(err, idempotency.ErrInProgress) {
		return err // not the driver's, or mapped already
	}
	switch me.Number {
	case erDupEntry:
		return fmt.Errorf("%w: %w", errDuplicate, err)
	case erLockWaitTimeout, erLockNowait:
		if waiting {
			return fmt.Errorf("%w: %w", idempotency.ErrInProgress, err)
		}
		return fmt.Errorf("%w: %w", idempotency.ErrConflict, err)
	case erLockDeadlock, erCheckRead:
		return fmt.Errorf("%w: %w", idempotency.ErrConflict, err)
	}
	return err
}

// wrapErr maps err (see mapError; an error mapped already is kept),
// prefixes it with a message and, once ctx is done, makes
// sure ctx.Err() is in the chain (the driver may report a cancelled
// statement as a broken connection). A nil err stays nil.
func wrapErr(ctx context.Context, err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	err = mapError(err, false)
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w (%w)", cerr, err)
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}
