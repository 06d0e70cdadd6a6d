package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
)

// DefaultTable is the table [New] uses when [Config.Table] is empty.
const DefaultTable = "idempotency_keys"

// maxIdentLen is PostgreSQL's longest identifier (NAMEDATALEN - 1).
const maxIdentLen = 63

// rollbackTimeout bounds the ROLLBACK sent when a transaction is abandoned,
// possibly after the caller's context ended.
const rollbackTimeout = 5 * time.Second

var _ idempotency.KeyStore[pgx.Tx] = (*Store)(nil)
var _ idempotency.ConflictClassifier = (*Store)(nil)

// Config tunes a [Store]. The zero value (or nil) means the defaults.
type Config struct {
	// Table is the keys table: a name of letters, digits and underscores,
	// not starting with a digit, at most 63 bytes, optionally qualified by
	// one schema name of the same form ("billing.idempotency_keys"). It is
	// quoted in SQL, so it is case-sensitive. Defaults to "idempotency_keys".
	Table string
	// TxOptions begin the transaction that holds the key and in which fn
	// runs (isolation level, deferrable mode, BeginQuery, CommitQuery; the
	// access mode cannot be read only). Defaults to the zero value: a plain
	// BEGIN, at the session's default isolation level.
	TxOptions pgx.TxOptions
	// SkipLookup leaves out the plain SELECT that Reserve sends, outside any
	// transaction, before it begins the transaction that reserves the key:
	// a new key then costs three round trips (the effect's included), as
	// many as the bare effect transaction, and a replay two instead of one
	// (the look-up then travels with BEGIN and the reservation; see the
	// package documentation). Defaults to false: a replay of a completed key
	// costs one round trip, like on the other SQL stores, and a new key four.
	SkipLookup bool
}

// Store is an [idempotency.KeyStore] on a PostgreSQL table. It is safe for
// concurrent use; build it with [New].
type Store struct {
	pool        *pgxpool.Pool
	table       string // as configured, validated
	txOptions   pgx.TxOptions
	lookupFirst bool
	commitSQL   string

	schema      string
	migrateSQL  string
	lookupSQL   string
	insertSQL   string
	takeOverSQL string
	completeSQL string
	purgeSQL    string
}

// New returns a Store on pool. A nil cfg means the defaults. A bad table
// name gives an error wrapping [idempotency.ErrInvalidConfig]; New sends no
// SQL (see [Store.Migrate]).
func New(pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: postgres: nil pool", idempotency.ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	q, err := quoteTable(c.Table)
	if err != nil {
		return nil, err
	}
	if c.TxOptions.AccessMode == pgx.ReadOnly {
		return nil, fmt.Errorf("%w: postgres: TxOptions.AccessMode read only: the key is written in that transaction", idempotency.ErrInvalidConfig)
	}
	s := &Store{
		pool:        pool,
		table:       c.Table,
		txOptions:   c.TxOptions,
		lookupFirst: !c.SkipLookup,
		commitSQL:   "commit",
		schema:      schemaSQL(c.Table, q),
	}
	if c.TxOptions.CommitQuery != "" {
		s.commitSQL = c.TxOptions.CommitQuery
	}
	h := fnv.New64a()
	h.Write([]byte("idempotency/postgres " + q))
	s.migrateSQL = fmt.Sprintf("SELECT pg_advisory_xact_lock(%d);\n%s", int64(h.Sum64()), s.schema)
	// The key's row if it is completed or expired (a live pending row is
	// held by an open transaction, so this statement cannot see it).
	s.lookupSQL = `SELECT fingerprint, status, header, body, created_at, expires_at FROM ` + q +
		` WHERE scope = $1 AND id = $2 AND (state = 'completed' OR expires_at <= $3)`
	s.insertSQL, s.takeOverSQL = reservationSQL(q)
	// The key row is found by the ctid the reservation returned (stable:
	// the transaction holds the row); the other conditions only check it.
	s.completeSQL = `UPDATE ` + q + ` SET state = 'completed', status = $4, header = $5, body = $6, expires_at = $7
WHERE ctid = $1 AND scope = $2 AND id = $3 AND state = 'pending'`
	// The oldest expired rows, found through the expires_at index (a scan
	// of the table would walk over the rows earlier batches deleted, which
	// stay until VACUUM), locked, then deleted by ctid.
	s.purgeSQL = `DELETE FROM ` + q + ` WHERE ctid = ANY (ARRAY(SELECT ctid FROM ` + q +
		` WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))`
	return s, nil
}

// Schema returns the DDL of the keys table named table (see [Config.Table]),
// for users' migrations: CREATE TABLE IF NOT EXISTS and CREATE INDEX IF NOT
// EXISTS, safe to run again.
func Schema(table string) (string, error) {
	q, err := quoteTable(table)
	if err != nil {
		return "", err
	}
	return schemaSQL(table, q), nil
}

// Schema returns the DDL of s's table; see the package-level [Schema].
func (s *Store) Schema() string { return s.schema }

// Migrate creates s's table and its index if they do not exist. It is
// idempotent and safe to run from several processes at once.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, s.migrateSQL); err != nil {
		return fmt.Errorf("postgres: migrate %s: %w", s.table, err)
	}
	return nil
}

// Reserve implements [idempotency.KeyStore]. It acquires one connection
// and, in one round trip, begins the transaction and inserts the key row
// (see reservationSQL). A key held by another open transaction makes the
// insert wait up to r.Wait, or until ctx's deadline if that comes first (a
// lock_timeout; 1ms when r.Wait is 0), and while ctx lives. If a committed
// row is in the way, a second round trip ends the transaction and reads it:
// a live completed row is returned, an expired one taken over. Unless
// [Config.SkipLookup] is set, a plain look-up comes first.
func (s *Store) Reserve(ctx context.Context, r idempotency.Reservation) (idempotency.Txn[pgx.Tx], *idempotency.Record, error) {
	now := r.Now.Truncate(time.Microsecond)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, classify(ctx, fmt.Errorf("postgres: acquire: %w", err), false)
	}
	expired := false
	if s.lookupFirst {
		var rec *idempotency.Record
		rec, expired, err = scanKey(conn.QueryRow(ctx, s.lookupSQL, r.Key.Scope, r.Key.ID, now), r.Key, now)
		if err != nil || rec != nil {
			abandon(ctx, conn)
			if err != nil {
				return nil, nil, classify(ctx, fmt.Errorf("postgres: look up key %q: %w", r.Key.ID, err), false)
			}
			return nil, rec, nil
		}
	}
	if !expired {
		t, err := s.begin(ctx, conn, s.insertSQL, r, now)
		if err != nil {
			return nil, nil, err
		}
		if t != nil {
			return t, nil, nil
		}
		// A committed row holds the key (the insert waited for any open
		// transaction that held it), newer than the statement's snapshot
		// maybe: end the transaction and read the row in a fresh statement,
		// on the same connection, in the same round trip.
		var rec *idempotency.Record
		b := &pgx.Batch{}
		b.Queue("rollback")
		b.Queue(s.lookupSQL, r.Key.Scope, r.Key.ID, now)
		br := conn.SendBatch(ctx, b)
		_, err = br.Exec()
		if err == nil {
			rec, expired, err = scanKey(br.QueryRow(), r.Key, now)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil || rec != nil {
			abandon(ctx, conn)
			if err != nil {
				return nil, nil, classify(ctx, fmt.Errorf("postgres: read key %q: %w", r.Key.ID, err), false)
			}
			return nil, rec, nil
		}
	}
	if expired {
		t, err := s.begin(ctx, conn, s.takeOverSQL, r, now)
		if err != nil {
			return nil, nil, err
		}
		if t != nil {
			return t, nil, nil
		}
	}
	// Purged, taken over by another caller, or never completed since the
	// insert saw it: the key is worth competing for again.
	abandon(ctx, conn)
	return nil, nil, fmt.Errorf("%w: key %q changed while it was read", idempotency.ErrConflict, r.Key.ID)
}

// begin begins the transaction and runs stmt (insertSQL or takeOverSQL) in
// one round trip. It returns the reservation if stmt reserved the key row,
// nil (and the transaction still open) if a committed row was in the way.
// On an error it releases conn.
func (s *Store) begin(ctx context.Context, conn *pgxpool.Conn, stmt string, r idempotency.Reservation, now time.Time) (*txn, error) {
	b := &pgx.Batch{}
	b.BeginTx(s.txOptions)
	b.Queue(stmt, r.Key.Scope, r.Key.ID, r.Fingerprint, now, r.ExpiresAt.Truncate(time.Microsecond), lockTimeout(ctx, r.Wait))
	br := conn.SendBatch(ctx, b)
	var row pgtype.TID
	_, err := br.Exec() // begin
	if err == nil {
		err = br.QueryRow().Scan(&row, nil)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		abandon(ctx, conn)
		return nil, classify(ctx, fmt.Errorf("postgres: reserve key %q (wait bound %v): %w", r.Key.ID, r.Wait, err), true)
	}
	if !row.Valid {
		return nil, nil
	}
	return &txn{s: s, conn: conn, tx: &tx{inner: br.Tx()}, key: r.Key, row: row}, nil
}

// reservationSQL returns the two statements that reserve a key on the
// quoted table q: insertSQL inserts the pending key row, takeOverSQL turns
// an expired row into it. Their parameters: scope $1, id $2, fingerprint
// $3, now $4, expires_at $5 and the wait bound $6 (a lock_timeout value);
// every one is cast, so that the simple protocol works too. Each returns
// the ctid of the row it reserved (with which the completion finds the row
// without an index scan), or no row.
//
// The wait bound is a lock_timeout local to the transaction, set by the
// statement itself before it can wait (in its FROM list, after saving the
// session's value) and restored by its RETURNING list once it has reserved
// the row, so that fn's statements run under the session's lock_timeout.
// (When nothing is reserved the transaction is rolled back.)
//
// The insert is ON CONFLICT DO NOTHING: it waits for an open transaction
// that holds the key and, once that has ended, locks nothing. DO UPDATE
// (which could take over an expired row in the same statement) would lock
// the live row even when its WHERE fails, and so make all the waiters of a
// key queue behind each other's rollback. A new key reads nothing, so under
// SERIALIZABLE it takes no predicate lock.
func reservationSQL(q string) (insertSQL, takeOverSQL string) {
	const bound = `(SELECT set_config('lock_timeout', $6::text, true)
	FROM (SELECT set_config('idempotency.saved_lock_timeout', current_setting('lock_timeout'), true) OFFSET 0) saved
	OFFSET 0) bound`
	const restore = `set_config('lock_timeout', current_setting('idempotency.saved_lock_timeout'), true)`
	insertSQL = `INSERT INTO ` + q + ` (scope, id, fingerprint, state, created_at, expires_at)
SELECT $1::text, $2::text, $3::text, 'pending', $4::timestamptz, $5::timestamptz FROM ` + bound + `
ON CONFLICT (scope, id) DO NOTHING
RETURNING ctid, ` + restore
	takeOverSQL = `UPDATE ` + q + ` AS k SET fingerprint = $3::text, state = 'pending', status = NULL, header = NULL, body = NULL,
	created_at = $4::timestamptz, expires_at = $5::timestamptz
FROM ` + bound + `
WHERE k.scope = $1::text AND k.id = $2::text AND k.expires_at <= $4::timestamptz
RETURNING k.ctid, ` + restore
	return insertSQL, takeOverSQL
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

// scanKey scans a row of lookupSQL: a live completed record, or expired
// true for an expired row (neither for no row).
func scanKey(row pgx.Row, key idempotency.Key, now time.Time) (rec *idempotency.Record, expired bool, err error) {
	var (
		fp                 string
		status             *int
		header, body       []byte
		created, expiresAt time.Time
	)
	err = row.Scan(&fp, &status, &header, &body, &created, &expiresAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	case !expiresAt.After(now):
		return nil, true, nil
	case status == nil:
		return nil, false, fmt.Errorf("postgres: completed key %q has no status", key.ID)
	}
	rec, err = newRecord(key, fp, *status, header, body, created, expiresAt)
	return rec, false, err
}

// newRecord builds the record of a completed key row.
func newRecord(key idempotency.Key, fp string, status int, header, body []byte, created, expiresAt time.Time) (*idempotency.Record, error) {
	rec := &idempotency.Record{Key: key, Fingerprint: fp, Status: status, Body: body, CreatedAt: created, ExpiresAt: expiresAt}
	h, err := idempotency.UnmarshalHeader(header)
	if err != nil {
		return nil, fmt.Errorf("postgres: stored header of key %q: %w", key.ID, err)
	}
	rec.Header = h
	return rec, nil
}

// Purge implements [idempotency.KeyStore]: one DELETE (its own implicit
// transaction) of at most limit rows whose expires_at <= before, skipping
// rows locked by open transactions.
func (s *Store) Purge(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, s.purgeSQL, before.Truncate(time.Microsecond), limit)
	if err != nil {
		return 0, classify(ctx, fmt.Errorf("postgres: purge: %w", err), false)
	}
	return int(tag.RowsAffected()), nil
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
	conn.Release()
}

// IsConflict implements [idempotency.ConflictClassifier]: a serialization
// failure (40001) or a deadlock (40P01) met by one of fn's own statements
// makes [idempotency.Guard.Do] roll back and run the attempt again.
func (s *Store) IsConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// classify maps the driver's errors to the root sentinels: serialization
// failures, deadlocks and lock timeouts wrap [idempotency.ErrConflict]
// (reservingLock: a lock timeout is our own wait bound and wraps
// [idempotency.ErrInProgress] instead); once ctx is done, ctx.Err() is in
// the chain.
func classify(ctx context.Context, err error, reservingLock bool) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) {
			return err
		}
		return fmt.Errorf("%w (%w)", cerr, err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case "40001", "40P01": // serialization_failure, deadlock_detected
		return fmt.Errorf("%w: %w", idempotency.ErrConflict, err)
	case "55P03": // lock_not_available
		if reservingLock {
			return fmt.Errorf("%w: %w", idempotency.ErrInProgress, err)
		}
		return fmt.Errorf("%w: %w", idempotency.ErrConflict, err)
	}
	return err
}

// quoteTable validates a table name and returns it quoted.
func quoteTable(table string) (string, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("%w: postgres: table %q: at most one schema qualifier", idempotency.ErrInvalidConfig, table)
	}
	for i, p := range parts {
		if !validIdent(p) {
			return "", fmt.Errorf("%w: postgres: table %q: want letters, digits and underscores, not starting with a digit, 1 to %d bytes",
				idempotency.ErrInvalidConfig, table, maxIdentLen)
		}
		parts[i] = `"` + p + `"`
	}
	return strings.Join(parts, "."), nil
}

func validIdent(s string) bool {
	if len(s) == 0 || len(s) > maxIdentLen || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// indexName names the expires_at index of table (unqualified, in the
// table's schema), within 63 bytes: a long name is cut and made unique by a
// hash, so that two long table names never share an index name.
func indexName(table string) string {
	name := table[strings.LastIndexByte(table, '.')+1:]
	const suffix = "_expires_at_idx"
	if len(name)+len(suffix) <= maxIdentLen {
		return name + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	tail := fmt.Sprintf("_%08x_exp_idx", h.Sum32())
	return name[:maxIdentLen-len(tail)] + tail
}

func schemaSQL(table, quoted string) string {
	return `CREATE TABLE IF NOT EXISTS ` + quoted + ` (
	scope       TEXT COLLATE "C" NOT NULL,
	id          TEXT COLLATE "C" NOT NULL,
	fingerprint TEXT NOT NULL,
	state       TEXT NOT NULL CHECK (state IN ('pending', 'completed')),
	status      INTEGER,
	header      BYTEA,
	body        BYTEA,
	created_at  TIMESTAMPTZ NOT NULL,
	expires_at  TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (scope, id)
);
CREATE INDEX IF NOT EXISTS "` + indexName(table) + `" ON ` + quoted + ` (expires_at);
`
}
