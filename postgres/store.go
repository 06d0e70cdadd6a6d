package postgres

import (
	"database/sql"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/lookup"
)

// rollbackTimeout bounds the ROLLBACK sent when a transaction is abandoned,
// possibly after the caller's context ended.
const rollbackTimeout = 5 * time.Second

var _ idempotency.KeyStore[pgx.Tx] = (*Store)(nil)
var _ backend.ConflictClassifier = (*Store)(nil)

// Config tunes a [Store]. The zero value (or nil) means the defaults.
type Config struct {
	// Table is the keys table. Its name has letters, digits and
	// underscores, does not start with a digit and has at most 63 bytes. It
	// may be qualified by one schema name of the same form
	// ("billing.idempotency_keys"). It is
	// quoted in SQL, so it is case-sensitive. Defaults to "idempotency_keys".
	Table string
	// TxOptions begin the transaction that holds the key and in which fn
	// runs (isolation level, deferrable mode, BeginQuery, CommitQuery; the
	// access mode cannot be read only). Defaults to the zero value: a plain
	// BEGIN, at the session's default isolation level.
	TxOptions pgx.TxOptions
	// Lookup says when Reserve reads the key with a plain SELECT, outside
	// any transaction, before it begins the transaction. With it a replay
	// of a completed key costs one round trip instead of two, and a new
	// key four instead of three. [backend.LookupAlways] always sends
	// it; [backend.LookupNever] never does (the look-up that travels
	// with BEGIN still answers replays). Defaults to
	// [backend.LookupAdaptive]: the store sends it only while most of
	// its recent first tries found a completed key (see the package
	// documentation).
	Lookup backend.LookupPolicy
	// Clock is for tests only. When set, the store reads it instead of the
	// server's clock wherever it judges or stores a time (a record's
	// expiry, its creation, Purge). It sends the reading with each
	// statement. Nil is the default and the only setting for a service
	// with several instances. It uses PostgreSQL's own clock
	// (clock_timestamp(), and now() for the creation time), which every
	// instance shares: no time of the application is ever sent. A test
	// clock must never differ between instances. A reading outside
	// [backend.MinClock] .. [backend.MaxExpiry] is refused with
	// [idempotency.ErrInvalidConfig] before anything is written.
	Clock func() time.Time
}

// Store is an [idempotency.KeyStore] on a PostgreSQL table. It is safe for
// concurrent use; build it with [New].
type Store struct {
	pool *pgxpool.Pool // the pgx front end's, nil for a DBStore's
	db   *sql.DB       // a DBStore's, nil for the pgx front end's
	q    querier       // either front end's single statements
	// beginSQL is the BEGIN of Batch.BeginTx with txOptions, which a
	// DBStore's link runs as a BeginTx of sqlTxOptions.
	beginSQL     string
	sqlTxOptions *sql.TxOptions
	table        string // as configured, validated
	quoted       string // table, quoted for SQL
	tableName    string // the table's name without its schema
	schemaName   string // the table's schema, "" if not qualified
	txOptions    pgx.TxOptions
	lookup       backend.LookupPolicy
	clock        func() time.Time // Config.Clock: nil for the server's
	commitSQL    string
	schema       string
	sql          statements
	tracer       pgx.QueryTracer // the pool's, for the batches of sendBatch
	// rowMode: reserve with a pending row too (see beginRow), because the
	// transactions are REPEATABLE READ or SERIALIZABLE.
	rowMode atomic.Bool
	// firstTries: while most recent first tries found a completed key,
	// Reserve looks the key up first.
	firstTries lookup.Tally
}

// lookingFirst reports whether Reserve should look the key up first.
func (s *Store) lookingFirst() bool {
	switch s.lookup {
	case backend.LookupAlways:
		return true
	case backend.LookupNever:
		return false
	}
	return s.firstTries.Replays()
}

// New returns a Store on pool. A nil cfg means the defaults. A bad table
// name, access mode or look-up policy gives an error wrapping
// [idempotency.ErrInvalidConfig]; New sends no SQL (see [Store.Migrate]).
func New(pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: postgres: nil pool", idempotency.ErrInvalidConfig)
	}
	s, err := newStore(cfg)
	if err != nil {
		return nil, err
	}
	s.pool, s.q, s.tracer = pool, pgxQuerier{pool}, pool.Config().ConnConfig.Tracer
	return s, nil
}

// newStore validates cfg and builds the store of either front end, which
// then sets its own connections.
func newStore(cfg *Config) (*Store, error) {
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
	if err := c.Lookup.Validate(); err != nil {
		return nil, fmt.Errorf("postgres: Config.Lookup: %w", err)
	}
	if c.TxOptions.AccessMode == pgx.ReadOnly {
		return nil, fmt.Errorf("%w: postgres: TxOptions.AccessMode read only: the key is written in that transaction", idempotency.ErrInvalidConfig)
	}
	s := &Store{
		table:     c.Table,
		quoted:    q,
		tableName: c.Table,
		txOptions: c.TxOptions,
		lookup:    c.Lookup,
		clock:     c.Clock,
		commitSQL: "commit",
		schema:    schemaSQL(c.Table, q),
		sql:       newStatements(c.Table, q),
	}
	b := &pgx.Batch{}
	b.BeginTx(c.TxOptions)
	s.beginSQL = b.QueuedQueries[0].SQL
	if i := strings.IndexByte(c.Table, '.'); i >= 0 {
		s.schemaName, s.tableName = c.Table[:i], c.Table[i+1:]
	}
	switch c.TxOptions.IsoLevel {
	case pgx.RepeatableRead, pgx.Serializable:
		s.rowMode.Store(true)
	}
	if c.TxOptions.CommitQuery != "" {
		s.commitSQL = c.TxOptions.CommitQuery
	}
	return s, nil
}

// now is the value of the statements' clock parameter: nil, which makes
// them read the server's clock, or the reading of the test clock
// ([Config.Clock]), in microseconds, rounded down.
func (s *Store) now() (any, error) {
	if s.clock == nil {
		return nil, nil
	}
	now := s.clock()
	if err := backend.CheckClock(now); err != nil {
		return nil, fmt.Errorf("postgres: Config.Clock: %w", err)
	}
	return now.Truncate(time.Microsecond), nil
}
