package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
)

// Message is one outbox row as the relay hands it to a [Publisher].
type Message struct {
	// Seq is the row's position in the table; rows are claimed in Seq
	// order.
	Seq int64
	// MsgID is the row's [Event.MsgID]: publish it as the broker's
	// deduplication id (JetStream's Nats-Msg-Id).
	MsgID string
	// Subject is the [Event.Subject].
	Subject string
	// Header is the [Event.Header]; nil if it had none.
	Header map[string][]string
	// Payload is the [Event.Payload], byte-exact.
	Payload []byte
}

// Publisher sends a batch of outbox messages to a broker.
//
// Publish returns nil only when the broker has durably accepted every
// message of msgs; the relay then marks them sent. Any error leaves every
// message of the batch unsent. A later batch publishes them again, under
// the same MsgID, so a Publisher may have published some of them already.
// The broker's deduplication or the consumers' idempotency absorbs the
// repeat. Publish must return promptly once ctx is done and must not use
// the relay's database.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) error
}

// PublisherFunc adapts a function to [Publisher].
type PublisherFunc func(ctx context.Context, msgs []Message) error

// Publish calls f(ctx, msgs).
func (f PublisherFunc) Publish(ctx context.Context, msgs []Message) error { return f(ctx, msgs) }

// RelayConfig tunes a [Relay]. The zero value (or nil) means the defaults.
type RelayConfig struct {
	// Batch is the most rows one transaction claims, publishes and marks.
	// Defaults to [DefaultBatch] (100).
	Batch int
	// Interval is how long [Relay.Run] sleeps when it found fewer than
	// Batch rows (or failed) before it looks again. Defaults to
	// [DefaultInterval] (1s).
	Interval time.Duration
	// PublishTimeout bounds one batch's [Publisher.Publish], during which
	// the batch's rows stay locked. Defaults to [DefaultPublishTimeout]
	// (30s).
	PublishTimeout time.Duration
	// OnError, if set, is told about every failed batch of [Relay.Run]
	// (which then waits Interval and tries again). Defaults to nil: no
	// report.
	OnError func(ctx context.Context, err error)
}

// Defaults of [RelayConfig].
const (
	DefaultBatch          = 100
	DefaultInterval       = time.Second
	DefaultPublishTimeout = 30 * time.Second
)

// Relay publishes the unsent rows of an outbox table and marks them sent.
// Several relays, in one process or many, can run on one table at once:
// each batch is claimed with SELECT ... FOR UPDATE SKIP LOCKED (PostgreSQL,
// MySQL/MariaDB), so two relays never hold the same row, and a relay that
// dies releases its rows with its connection. On SQLite the relays of one
// file take turns on its write lock (open it with sqlite.Open, whose
// transactions take the write lock at BEGIN).
//
// Order: within one batch, messages are handed to the Publisher in Seq
// order; with several relays, batches are published concurrently, so order
// across batches is not kept. Run one relay per table for a total order.
//
// A batch uses one connection of the pool for its whole transaction, and
// no other: the relay never asks for a second connection while it holds
// one. Safe for concurrent use; build it with [NewRelay] or [NewSQLRelay].
type Relay struct {
	o   *Outbox
	src source
	pub Publisher
	cfg RelayConfig
}

// source is one database's claim, mark and purge.
type source interface {
	batch(ctx context.Context, limit int, publish func([]Message) error) (int, error)
	purgeSent(ctx context.Context, olderThan time.Duration, limit int) (int, error)
}

// NewRelay returns a Relay on a PostgreSQL pool for o (Postgres dialect).
// Errors wrap [idempotency.ErrInvalidConfig].
func NewRelay(o *Outbox, pool *pgxpool.Pool, pub Publisher, cfg *RelayConfig) (*Relay, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: outbox: nil pool", idempotency.ErrInvalidConfig)
	}
	if o != nil && o.dialect != Postgres {
		return nil, fmt.Errorf("%w: outbox: NewRelay (pgx) needs the Postgres dialect, not %v", idempotency.ErrInvalidConfig, o.dialect)
	}
	return newRelay(o, func() source { return &pgxSource{pool: pool, o: o} }, pub, cfg)
}

// NewSQLRelay returns a Relay on a *sql.DB for o, in o's dialect.
// Errors wrap [idempotency.ErrInvalidConfig].
func NewSQLRelay(o *Outbox, db *sql.DB, pub Publisher, cfg *RelayConfig) (*Relay, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: outbox: nil db", idempotency.ErrInvalidConfig)
	}
	return newRelay(o, func() source { return &sqlSource{db: db, o: o} }, pub, cfg)
}

func newRelay(o *Outbox, src func() source, pub Publisher, cfg *RelayConfig) (*Relay, error) {
	if o == nil {
		return nil, fmt.Errorf("%w: outbox: nil Outbox", idempotency.ErrInvalidConfig)
	}
	if pub == nil {
		return nil, fmt.Errorf("%w: outbox: nil Publisher", idempotency.ErrInvalidConfig)
	}
	var c RelayConfig
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.Batch < 0:
		return nil, fmt.Errorf("%w: outbox: negative Batch %d", idempotency.ErrInvalidConfig, c.Batch)
	case c.Interval < 0:
		return nil, fmt.Errorf("%w: outbox: negative Interval %v", idempotency.ErrInvalidConfig, c.Interval)
	case c.PublishTimeout < 0:
		return nil, fmt.Errorf("%w: outbox: negative PublishTimeout %v", idempotency.ErrInvalidConfig, c.PublishTimeout)
	}
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	return &Relay{o: o, src: src(), pub: pub, cfg: c}, nil
}

// RunOnce claims up to [RelayConfig.Batch] unsent rows in one transaction,
// publishes them, marks them sent and commits, and reports how many it
// marked sent. 0 with a nil error means no unsent row was free. On any
// error the transaction is rolled back and no row is marked sent.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	return r.src.batch(ctx, r.cfg.Batch, func(msgs []Message) error {
		pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
		defer cancel()
		if err := r.pub.Publish(pctx, msgs); err != nil {
			return fmt.Errorf("outbox: publish %d messages (seq %d..%d): %w", len(msgs), msgs[0].Seq, msgs[len(msgs)-1].Seq, err)
		}
		return nil
	})
}

// Run calls [Relay.RunOnce] until ctx ends, at once again after a full
// batch, after [RelayConfig.Interval] otherwise; failed batches go to
// [RelayConfig.OnError] and are retried after Interval. It returns
// ctx.Err().
func (r *Relay) Run(ctx context.Context) error {
	for {
		n, err := r.RunOnce(ctx)
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if err != nil && r.cfg.OnError != nil {
			r.cfg.OnError(ctx, err)
		}
		if err == nil && n == r.cfg.Batch {
			continue
		}
		t := time.NewTimer(r.cfg.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// PurgeSent deletes at most limit rows that were marked sent more than
// olderThan ago, in one statement, and reports how many it deleted. Call it
// from a ticker, with olderThan longer than the broker's deduplication
// window.
func (r *Relay) PurgeSent(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	return r.src.purgeSent(ctx, olderThan, limit)
}

// rollbackTimeout bounds a ROLLBACK sent after the caller's ctx ended.
const rollbackTimeout = 5 * time.Second

type pgxSource struct {
	pool *pgxpool.Pool
	o    *Outbox
}

func (s *pgxSource) batch(ctx context.Context, limit int, publish func([]Message) error) (n int, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox: begin: %w", err)
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		if rerr := tx.Rollback(rctx); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) && err != nil {
			err = errors.Join(err, fmt.Errorf("outbox: rollback: %w", rerr))
		}
	}()
	rows, err := tx.Query(ctx, `SELECT seq, msg_id, subject, header, payload FROM `+s.o.quoted+
		` WHERE sent_at IS NULL ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED`, limit)
	if err != nil {
		return 0, fmt.Errorf("outbox: claim: %w", err)
	}
	msgs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Message, error) {
		var m Message
		var header []byte
		if err := row.Scan(&m.Seq, &m.MsgID, &m.Subject, &header, &m.Payload); err != nil {
			return m, err
		}
		return m, decodeHeader(header, &m)
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: claim: %w", err)
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	if err := publish(msgs); err != nil {
		return 0, err
	}
	seqs := make([]int64, len(msgs))
	for i, m := range msgs {
		seqs[i] = m.Seq
	}
	if _, err := tx.Exec(ctx, `UPDATE `+s.o.quoted+` SET sent_at = now() WHERE seq = ANY($1)`, seqs); err != nil {
		return 0, fmt.Errorf("outbox: mark sent: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("outbox: commit: %w", err)
	}
	committed = true
	return len(msgs), nil
}

func (s *pgxSource) purgeSent(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+s.o.quoted+` WHERE seq = ANY (ARRAY(SELECT seq FROM `+s.o.quoted+
		` WHERE sent_at < now() - make_interval(secs => $1) ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED))`,
		olderThan.Seconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("outbox: purge sent: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

type sqlSource struct {
	db *sql.DB
	o  *Outbox
}

func (s *sqlSource) batch(ctx context.Context, limit int, publish func([]Message) error) (n int, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("outbox: begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) && err != nil {
				err = errors.Join(err, fmt.Errorf("outbox: rollback: %w", rerr))
			}
		}
	}()
	claim := `SELECT seq, msg_id, subject, header, payload FROM ` + s.o.quoted +
		` WHERE sent_at IS NULL ORDER BY seq LIMIT ` + s.o.placeholders(1, 1)
	if s.o.dialect != SQLite {
		claim += ` FOR UPDATE SKIP LOCKED`
	}
	rows, err := tx.QueryContext(ctx, claim, limit)
	if err != nil {
		return 0, fmt.Errorf("outbox: claim: %w", err)
	}
	var msgs []Message
	for rows.Next() {
		var m Message
		var header []byte
		if err := rows.Scan(&m.Seq, &m.MsgID, &m.Subject, &header, &m.Payload); err != nil {
			rows.Close()
			return 0, fmt.Errorf("outbox: claim: %w", err)
		}
		if err := decodeHeader(header, &m); err != nil {
			rows.Close()
			return 0, fmt.Errorf("outbox: claim: %w", err)
		}
		if m.Payload == nil {
			m.Payload = []byte{}
		}
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("outbox: claim: %w", err)
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	if err := publish(msgs); err != nil {
		return 0, err
	}
	args := make([]any, len(msgs))
	for i, m := range msgs {
		args[i] = m.Seq
	}
	now := "CURRENT_TIMESTAMP(6)"
	switch s.o.dialect {
	case Postgres:
		now = "now()"
	case SQLite:
		now = sqliteNowMillis
	}
	mark := `UPDATE ` + s.o.quoted + ` SET sent_at = ` + now + ` WHERE seq IN (` + s.o.placeholders(1, len(args)) + `)`
	if _, err := tx.ExecContext(ctx, mark, args...); err != nil {
		return 0, fmt.Errorf("outbox: mark sent: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("outbox: commit: %w", err)
	}
	committed = true
	return len(msgs), nil
}

func (s *sqlSource) purgeSent(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	q := s.o.quoted
	var stmt string
	var args []any
	switch s.o.dialect {
	case MySQL:
		stmt = `DELETE FROM ` + q + ` WHERE sent_at < CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND ORDER BY seq LIMIT ?`
		args = []any{olderThan.Microseconds(), limit}
	case SQLite:
		stmt = `DELETE FROM ` + q + ` WHERE seq IN (SELECT seq FROM ` + q + ` WHERE sent_at < ` + sqliteNowMillis +
			` - ? ORDER BY seq LIMIT ?)`
		args = []any{olderThan.Milliseconds(), limit}
	default:
		stmt = `DELETE FROM ` + q + ` WHERE seq IN (SELECT seq FROM ` + q +
			` WHERE sent_at < now() - make_interval(secs => $1) ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED)`
		args = []any{olderThan.Seconds(), limit}
	}
	res, err := s.db.ExecContext(ctx, stmt, args...)
	if err != nil {
		return 0, fmt.Errorf("outbox: purge sent: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("outbox: purge sent: %w", err)
	}
	return int(n), nil
}

func decodeHeader(b []byte, m *Message) error {
	if len(b) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, &m.Header); err != nil {
		return fmt.Errorf("outbox: row %d: header: %w", m.Seq, err)
	}
	return nil
}
