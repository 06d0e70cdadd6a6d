package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
}

// Store is an [idempotency.KeyStore] on a PostgreSQL table. It is safe for
// concurrent use; build it with [New].
type Store struct {
	pool      *pgxpool.Pool
	table     string // as configured, validated
	txOptions pgx.TxOptions
	commitSQL string

	schema      string
	migrateSQL  string
	lookupSQL   string
	reserveSQL  string
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
		pool:      pool,
		table:     c.Table,
		txOptions: c.TxOptions,
		commitSQL: "commit",
		schema:    schemaSQL(c.Table, q),
	}
	if c.TxOptions.CommitQuery != "" {
		s.commitSQL = c.TxOptions.CommitQuery
	}
	h := fnv.New64a()
	h.Write([]byte("idempotency/postgres " + q))
	s.migrateSQL = fmt.Sprintf("SELECT pg_advisory_xact_lock(%d);\n%s", int64(h.Sum64()), s.schema)
	s.lookupSQL = `SELECT fingerprint, status, header, body, created_at, expires_at FROM ` + q +
		` WHERE scope = $1 AND id = $2 AND state = 'completed' AND expires_at > $3`
	s.reserveSQL = `INSERT INTO ` + q + ` AS k (scope, id, fingerprint, state, created_at, expires_at)
VALUES ($1, $2, $3, 'pending', $4, $5)
ON CONFLICT (scope, id) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, state = 'pending',
	status = NULL, header = NULL, body = NULL, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
WHERE k.expires_at <= EXCLUDED.created_at
RETURNING true`
	s.completeSQL = `UPDATE ` + q + ` SET state = 'completed', status = $3, header = $4, body = $5
WHERE scope = $1 AND id = $2 AND state = 'pending'`
	s.purgeSQL = `DELETE FROM ` + q + ` WHERE (scope, id) IN (SELECT scope, id FROM ` + q +
		` WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)`
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

// Reserve implements [idempotency.KeyStore]. It first looks the key up
// outside any transaction (a completed, live key costs that one round
// trip); otherwise it acquires one connection, begins the transaction and
// inserts (or takes over an expired) key row in one round trip. A key held
// by another open transaction makes the insert wait up to r.Wait, or until
// ctx's deadline if that comes first (a lock_timeout; 1ms when r.Wait is
// 0), and while ctx lives.
func (s *Store) Reserve(ctx context.Context, r idempotency.Reservation) (idempotency.Txn[pgx.Tx], *idempotency.Record, error) {
	now := r.Now.Truncate(time.Microsecond)
	rec, err := scanRecord(s.pool.QueryRow(ctx, s.lookupSQL, r.Key.Scope, r.Key.ID, now), r.Key)
	if err != nil {
		return nil, nil, classify(ctx, fmt.Errorf("postgres: look up key %q: %w", r.Key.ID, err), false)
	}
	if rec != nil {
		return nil, rec, nil
	}

	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, classify(ctx, fmt.Errorf("postgres: acquire: %w", err), false)
	}
	b := &pgx.Batch{}
	b.BeginTx(s.txOptions)
	b.Queue(saveLockTimeoutSQL)
	b.Queue(setLockTimeoutSQL, lockTimeout(ctx, r.Wait))
	b.Queue(s.reserveSQL, r.Key.Scope, r.Key.ID, r.Fingerprint, now, r.ExpiresAt.Truncate(time.Microsecond))
	b.Queue(restoreLockTimeoutSQL)
	br := conn.SendBatch(ctx, b)
	won, err := readReservation(br)
	if err != nil {
		abandon(ctx, conn)
		return nil, nil, classify(ctx, fmt.Errorf("postgres: reserve key %q (wait bound %v): %w", r.Key.ID, r.Wait, err), true)
	}
	if won {
		return &txn{s: s, conn: conn, tx: &tx{inner: br.Tx()}, key: r.Key}, nil, nil
	}

	// A live row is in the way, committed (the insert waited for any open
	// transaction that held it). The statement's snapshot may predate that
	// commit: end the transaction and read the row in a fresh statement, on
	// the same connection, in the same round trip.
	b = &pgx.Batch{}
	b.Queue("rollback")
	b.Queue(s.lookupSQL, r.Key.Scope, r.Key.ID, now)
	br = conn.SendBatch(ctx, b)
	_, err = br.Exec()
	if err == nil {
		rec, err = scanRecord(br.QueryRow(), r.Key)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	abandon(ctx, conn)
	if err != nil {
		return nil, nil, classify(ctx, fmt.Errorf("postgres: read key %q: %w", r.Key.ID, err), false)
	}
	if rec == nil {
		// Expired, purged or never completed since the insert saw it: the
		// key is worth competing for again.
		return nil, nil, fmt.Errorf("%w: key %q changed while it was read", idempotency.ErrConflict, r.Key.ID)
	}
	return nil, rec, nil
}

// The reservation's wait bound is a lock_timeout local to the transaction,
// saved before and restored right after the insert, so that fn's statements
// run under the lock_timeout the session had.
const (
	saveLockTimeoutSQL    = `SELECT set_config('idempotency.saved_lock_timeout', current_setting('lock_timeout'), true)`
	setLockTimeoutSQL     = `SELECT set_config('lock_timeout', $1, true)`
	restoreLockTimeoutSQL = `SELECT set_config('lock_timeout', current_setting('idempotency.saved_lock_timeout'), true)`
)

// readReservation reads the results of the reservation batch and closes it.
// won reports whether the key row was inserted or taken over.
func readReservation(br pgx.BatchResults) (won bool, err error) {
	for range 3 { // begin, save, set
		if _, err = br.Exec(); err != nil {
			break
		}
	}
	if err == nil {
		err = br.QueryRow().Scan(&won)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
	}
	if err == nil {
		_, err = br.Exec() // restore
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return won, err
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
	return fmt.Sprintf("%dms", ms)
}

// scanRecord scans a completed key row; no row gives (nil, nil).
func scanRecord(row pgx.Row, key idempotency.Key) (*idempotency.Record, error) {
	rec := &idempotency.Record{Key: key}
	var header []byte
	err := row.Scan(&rec.Fingerprint, &rec.Status, &header, &rec.Body, &rec.CreatedAt, &rec.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if header != nil {
		if err := json.Unmarshal(header, &rec.Header); err != nil {
			return nil, fmt.Errorf("postgres: stored header of key %q: %w", key.ID, err)
		}
	}
	return rec, nil
}

// encodeHeader stores a nil header as NULL, any other as JSON.
func encodeHeader(h http.Header) ([]byte, error) {
	if h == nil {
		return nil, nil
	}
	return json.Marshal(h)
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
