// Package outbox is a transactional outbox for the SQL stores of
// [idempotency]. The events an operation publishes are written through the
// same transaction as its effect and its idempotency key. A [Relay]
// publishes them later and marks them sent.
//
// Inside [idempotency.Guard.Do]'s fn, write the events through tx with
// [Outbox.Write] (a [pgx.Tx]) or [Outbox.WriteSQL] (a *sql.Tx). The effect,
// the key, the stored response and the events commit together or not at
// all. A rolled-back attempt leaves no event behind; a replay writes none.
//
// A [Relay] claims a batch of unsent rows (SELECT ... FOR UPDATE SKIP LOCKED
// on PostgreSQL and MySQL/MariaDB) and hands it to a [Publisher]. Once the
// publisher reports that the broker accepted every message, the relay marks
// the rows sent in the same transaction.
//
// Delivery is at least once. A relay that dies after publishing and before
// its commit leaves the rows unsent. The next relay publishes them again
// under the same [Message.MsgID]. A broker with deduplication absorbs the
// repeat within its window (JetStream's Nats-Msg-Id, see the outboxnats
// module). Consumers should still be idempotent.
//
// This package imports no broker client; the JetStream publisher lives in
// the nested module github.com/go-idempotency/idempotency/outbox/outboxnats.
package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/go-idempotency/idempotency"
)

// DefaultTable is the table [New] uses when [Config.Table] is empty.
const DefaultTable = "outbox"

// ErrInvalidEvent is returned (wrapped) by the writers for an event that
// cannot be stored: an invalid key, an empty purpose or subject. Nothing was
// written.
var ErrInvalidEvent = errors.New("outbox: invalid event")

// Dialect is the SQL dialect of an [Outbox]'s database.
type Dialect int

// The dialects an [Outbox] speaks.
const (
	// Postgres: PostgreSQL 12 or newer (pgx, or database/sql with the pgx
	// stdlib driver).
	Postgres Dialect = iota + 1
	// MySQL: MySQL 8.0+ or MariaDB 10.6+ on InnoDB (FOR UPDATE SKIP LOCKED).
	MySQL
	// SQLite: SQLite 3.35+ (modernc.org/sqlite). SQLite has one writer at a
	// time, so relays on one file take turns instead of skipping rows.
	SQLite
)

// String returns the dialect's name.
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case MySQL:
		return "mysql"
	case SQLite:
		return "sqlite"
	}
	return "Dialect(" + strconv.Itoa(int(d)) + ")"
}

// Config tunes an [Outbox]. The zero value (or nil) means the defaults.
type Config struct {
	// Table is the outbox table: letters, digits and underscores, not
	// starting with a digit, at most 63 bytes. On PostgreSQL and MySQL it
	// may be qualified by one schema (database) name of the same form.
	// Defaults to [DefaultTable].
	Table string
}

// Event is one message an operation publishes, written with the
// operation's effect.
type Event struct {
	// Key is the idempotency key of the operation that emits the event.
	Key idempotency.Key
	// Purpose names the event within the operation ("payment.created"):
	// an operation that emits two events gives each its own purpose.
	// With Key it determines [Event.MsgID].
	Purpose string
	// Subject is where the relay publishes it (a NATS subject).
	Subject string
	// Header is published with the message; it may be nil.
	Header map[string][]string
	// Payload is published byte-exact; it may be empty.
	Payload []byte
}

// MsgID returns the broker message id of e: Key.Derive("outbox", Purpose),
// 52 lower-case base32 characters. It is the same in every attempt and
// every process. So a broker that deduplicates on it (JetStream's
// Nats-Msg-Id) drops a relay's second publication of the row. A consumer
// keyed by it (idemnats' default) runs its effect once.
func (e Event) MsgID() string { return e.Key.Derive("outbox", e.Purpose) }

func (e Event) validate() error {
	if err := e.Key.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	if e.Purpose == "" {
		return fmt.Errorf("%w: empty purpose", ErrInvalidEvent)
	}
	if e.Subject == "" {
		return fmt.Errorf("%w: empty subject", ErrInvalidEvent)
	}
	return nil
}

// Outbox writes events to one outbox table. It holds no connection and is
// safe for concurrent use; build it with [New].
type Outbox struct {
	dialect Dialect
	table   string
	quoted  string
	schema  []string
}

// New returns an Outbox for a table in dialect d. A nil cfg means the
// defaults. A bad table name or dialect gives an error wrapping
// [idempotency.ErrInvalidConfig]; New sends no SQL.
func New(d Dialect, cfg *Config) (*Outbox, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if d != Postgres && d != MySQL && d != SQLite {
		return nil, fmt.Errorf("%w: outbox: unknown dialect %d", idempotency.ErrInvalidConfig, int(d))
	}
	q, err := quoteTable(d, c.Table)
	if err != nil {
		return nil, err
	}
	o := &Outbox{dialect: d, table: c.Table, quoted: q}
	o.schema = schemaSQL(d, c.Table, q)
	return o, nil
}

// Dialect returns o's dialect.
func (o *Outbox) Dialect() Dialect { return o.dialect }

// Table returns o's table name as configured.
func (o *Outbox) Table() string { return o.table }

// Schema returns the DDL of o's table, statement by statement, for users'
// migrations; every statement is safe to run again. Columns: seq (an
// increasing identity), msg_id, subject, header (JSON, NULL if none),
// payload, created_at, sent_at (NULL until the relay marks the row sent).
// An index serves the relay's scan of unsent rows.
func (o *Outbox) Schema() []string { return append([]string(nil), o.schema...) }

// Execer is what [Outbox.Migrate] needs: a *sql.DB or a *sql.Tx.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Migrate runs [Outbox.Schema] on db, one statement at a time.
func (o *Outbox) Migrate(ctx context.Context, db Execer) error {
	for _, stmt := range o.schema {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("outbox: migrate %s: %w", o.table, err)
		}
	}
	return nil
}

// PgxExecer is what [Outbox.MigratePgx] needs: a *pgxpool.Pool, a
// *pgx.Conn or a [pgx.Tx].
type PgxExecer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// MigratePgx runs [Outbox.Schema] on db, one statement at a time.
func (o *Outbox) MigratePgx(ctx context.Context, db PgxExecer) error {
	for _, stmt := range o.schema {
		if _, err := db.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("outbox: migrate %s: %w", o.table, err)
		}
	}
	return nil
}

// Write inserts events through tx, the transaction fn received from
// [idempotency.Guard.Do] on the postgres store: they commit with the effect
// and the key, or not at all. All events travel in one INSERT (one round
// trip). An invalid event gives an error wrapping [ErrInvalidEvent] and
// writes nothing. Write needs the Postgres dialect.
func (o *Outbox) Write(ctx context.Context, tx pgx.Tx, events ...Event) error {
	if o.dialect != Postgres {
		return fmt.Errorf("%w: outbox: Write (pgx.Tx) needs the Postgres dialect, not %v", idempotency.ErrInvalidConfig, o.dialect)
	}
	if len(events) == 0 {
		return nil
	}
	stmt, args, err := o.insert(events)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, stmt, args...); err != nil {
		return fmt.Errorf("outbox: write %d events to %s: %w", len(events), o.table, err)
	}
	return nil
}

// WriteSQL inserts events through tx, the *sql.Tx fn received from
// [idempotency.Guard.Do] (sqlite or mysql store, or PostgreSQL through
// database/sql). They commit with the effect and the key, or not at all.
// All events travel in one INSERT. An invalid event gives an error wrapping
// [ErrInvalidEvent] and writes nothing.
func (o *Outbox) WriteSQL(ctx context.Context, tx *sql.Tx, events ...Event) error {
	if len(events) == 0 {
		return nil
	}
	stmt, args, err := o.insert(events)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, stmt, args...); err != nil {
		return fmt.Errorf("outbox: write %d events to %s: %w", len(events), o.table, err)
	}
	return nil
}

func (o *Outbox) insert(events []Event) (string, []any, error) {
	var b strings.Builder
	b.WriteString("INSERT INTO " + o.quoted + " (msg_id, subject, header, payload) VALUES ")
	args := make([]any, 0, 4*len(events))
	for i, e := range events {
		if err := e.validate(); err != nil {
			return "", nil, fmt.Errorf("event %d: %w", i, err)
		}
		var header []byte
		if len(e.Header) > 0 {
			h, err := json.Marshal(e.Header)
			if err != nil {
				return "", nil, fmt.Errorf("%w: event %d: header: %w", ErrInvalidEvent, i, err)
			}
			header = h
		}
		payload := e.Payload
		if payload == nil {
			payload = []byte{}
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(" + o.placeholders(len(args)+1, 4) + ")")
		args = append(args, e.MsgID(), e.Subject, header, payload)
	}
	return b.String(), args, nil
}

// placeholders returns n comma-separated placeholders starting at number
// first ($first... on PostgreSQL, ? elsewhere).
func (o *Outbox) placeholders(first, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		if o.dialect == Postgres {
			b.WriteString("$" + strconv.Itoa(first+i))
		} else {
			b.WriteString("?")
		}
	}
	return b.String()
}

const maxIdentLen = 63

func quoteTable(d Dialect, table string) (string, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 || (d == SQLite && len(parts) > 1) {
		return "", fmt.Errorf("%w: outbox: table %q: too many qualifiers for %v", idempotency.ErrInvalidConfig, table, d)
	}
	for i, p := range parts {
		if !validIdent(p) {
			return "", fmt.Errorf("%w: outbox: table %q: want letters, digits and underscores, not starting with a digit, 1 to %d bytes",
				idempotency.ErrInvalidConfig, table, maxIdentLen)
		}
		if d == MySQL {
			parts[i] = "`" + p + "`"
		} else {
			parts[i] = `"` + p + `"`
		}
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

// indexName names the unsent-rows index of table, unqualified, within 63
// bytes (a long name is cut and made unique by a hash).
func indexName(table string) string {
	name := table[strings.LastIndexByte(table, '.')+1:]
	const suffix = "_unsent_idx"
	if len(name)+len(suffix) <= maxIdentLen {
		return name + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	tail := fmt.Sprintf("_%08x_uns_idx", h.Sum32())
	return name[:maxIdentLen-len(tail)] + tail
}

func schemaSQL(d Dialect, table, quoted string) []string {
	idx := indexName(table)
	switch d {
	case Postgres:
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + quoted + ` (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	msg_id     TEXT NOT NULL,
	subject    TEXT NOT NULL,
	header     BYTEA,
	payload    BYTEA NOT NULL,
	created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
	sent_at    TIMESTAMPTZ
)`,
			`CREATE INDEX IF NOT EXISTS "` + idx + `" ON ` + quoted + ` (seq) WHERE sent_at IS NULL`,
		}
	case MySQL:
		return []string{
			"CREATE TABLE IF NOT EXISTS " + quoted + ` (
	seq        BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
	msg_id     VARCHAR(255) NOT NULL,
	subject    VARCHAR(1024) NOT NULL,
	header     LONGBLOB NULL,
	payload    LONGBLOB NOT NULL,
	created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	sent_at    DATETIME(6) NULL,
	INDEX ` + "`" + idx + "`" + ` (sent_at, seq)
) ENGINE=InnoDB`,
		}
	default: // SQLite: times are Unix milliseconds.
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + quoted + ` (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	msg_id     TEXT NOT NULL,
	subject    TEXT NOT NULL,
	header     BLOB,
	payload    BLOB NOT NULL,
	created_at INTEGER NOT NULL DEFAULT (` + sqliteNowMillis + `),
	sent_at    INTEGER
)`,
			`CREATE INDEX IF NOT EXISTS "` + idx + `" ON ` + quoted + ` (seq) WHERE sent_at IS NULL`,
		}
	}
}

const sqliteNowMillis = `CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)`
