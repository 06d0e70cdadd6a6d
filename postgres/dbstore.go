package postgres

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

var (
	_ idempotency.KeyStore[*sql.Tx] = (*DBStore)(nil)
	_ backend.Stepper[*sql.Tx]      = (*DBStore)(nil)
	_ backend.KeyAdmin              = (*DBStore)(nil)
	_ backend.KeyLister             = (*DBStore)(nil)
	_ backend.QuotaCounter          = (*DBStore)(nil)
	_ backend.SchemaChecker         = (*DBStore)(nil)
	_ backend.ConflictClassifier    = (*DBStore)(nil)
	_ backend.Phase[*sql.Tx]        = sqlPhase{}
)

// DBStore is the store of [Store] on a *sql.DB: fn receives the *sql.Tx that
// holds the key, so handlers written for database/sql (pgx's stdlib driver,
// lib/pq, and what is built on them: GORM, bun, sqlx, ent, sqlc) run
// unchanged. Its table, schema, statements, locks and guarantees are
// [Store]'s (one implementation serves both); what differs is the number of
// round trips, since database/sql sends one statement at a time (see the
// package documentation). It is safe for concurrent use; build it with
// [NewDB].
//
// fn must not end the *sql.Tx (Commit, Rollback): the store commits it,
// with the key, when fn returns. If fn does, the call fails. Since a
// *sql.Tx cannot refuse fn's Commit, a DBStore always reserves a key with a
// pending row, as [Store] does under REPEATABLE READ and SERIALIZABLE: a
// transaction fn committed leaves the key held (never free for a second
// run) until the reservation's provisional expiry.
type DBStore struct{ s *Store }

// NewDB returns a DBStore on db, whose driver is pgx's stdlib ("pgx") or
// lib/pq ("postgres"), or any other PostgreSQL driver whose errors carry
// the SQLSTATE as one of those two do. A nil cfg means the defaults.
// cfg.TxOptions may set the isolation level only: database/sql has no
// deferrable mode nor custom BEGIN or COMMIT statements, and those are
// refused with [idempotency.ErrInvalidConfig], as are the errors of
// [New]. NewDB sends no SQL (see [DBStore.Migrate]).
//
// It is named for what it takes: New takes a *pgxpool.Pool and gives fn a
// pgx.Tx; NewDB takes a *sql.DB and gives fn a *sql.Tx.
func NewDB(db *sql.DB, cfg *Config) (*DBStore, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: postgres: nil *sql.DB", idempotency.ErrInvalidConfig)
	}
	s, err := newStore(cfg)
	if err != nil {
		return nil, err
	}
	o := s.txOptions
	if o.DeferrableMode != "" || o.BeginQuery != "" || o.CommitQuery != "" {
		return nil, fmt.Errorf("%w: postgres: NewDB: TxOptions may set IsoLevel only (database/sql has no deferrable mode, BeginQuery or CommitQuery)", idempotency.ErrInvalidConfig)
	}
	s.sqlTxOptions = &sql.TxOptions{}
	switch o.IsoLevel {
	case "":
	case pgx.ReadUncommitted:
		s.sqlTxOptions.Isolation = sql.LevelReadUncommitted
	case pgx.ReadCommitted:
		s.sqlTxOptions.Isolation = sql.LevelReadCommitted
	case pgx.RepeatableRead:
		s.sqlTxOptions.Isolation = sql.LevelRepeatableRead
	case pgx.Serializable:
		s.sqlTxOptions.Isolation = sql.LevelSerializable
	default:
		return nil, fmt.Errorf("%w: postgres: NewDB: unknown TxOptions.IsoLevel %q", idempotency.ErrInvalidConfig, o.IsoLevel)
	}
	s.db, s.q = db, sqlQuerier{db}
	// fn can commit a *sql.Tx: a pending row written at the reservation
	// keeps the key held after such a commit, until its provisional expiry.
	s.rowMode.Store(true)
	return &DBStore{s: s}, nil
}

// Reserve implements [idempotency.KeyStore] as [Store.Reserve] does, with
// the same statements: a plain look-up first when [Config.Lookup] says so,
// then BEGIN, the key's advisory lock and the pending row's INSERT (one
// round trip each here), at every isolation level (see [DBStore]).
func (d *DBStore) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*sql.Tx], *backend.Record, error) {
	t, rec, err := d.s.reserve(ctx, r)
	if t == nil {
		return nil, rec, err
	}
	return sqlTxn{t}, nil, nil
}

// Acquire implements [backend.Stepper] as [Store.Acquire] does.
func (d *DBStore) Acquire(ctx context.Context, a backend.Acquisition) (backend.Phase[*sql.Tx], *backend.Record, error) {
	p, rec, err := d.s.acquirePhase(ctx, a)
	if p == nil {
		return nil, rec, err
	}
	return sqlPhase{p}, nil, nil
}

// Abandoned implements [backend.Stepper] as [Store.Abandoned] does.
func (d *DBStore) Abandoned(ctx context.Context, q backend.AbandonedQuery) ([]backend.AbandonedKey, error) {
	return d.s.Abandoned(ctx, q)
}

// Purge implements [idempotency.KeyStore] as [Store.Purge] does.
func (d *DBStore) Purge(ctx context.Context, limit int) (int, error) { return d.s.Purge(ctx, limit) }

// Inspect implements [backend.KeyAdmin] as [Store.Inspect] does.
func (d *DBStore) Inspect(ctx context.Context, key idempotency.Key, body bool) (*backend.KeyInfo, error) {
	return d.s.Inspect(ctx, key, body)
}

// Forget implements [backend.KeyAdmin] as [Store.Forget] does.
func (d *DBStore) Forget(ctx context.Context, key idempotency.Key) (*backend.KeyInfo, error) {
	return d.s.Forget(ctx, key)
}

// List implements [backend.KeyLister] as [Store.List] does.
func (d *DBStore) List(ctx context.Context, q backend.ListQuery) (backend.KeyPage, error) {
	return d.s.List(ctx, q)
}

// Stats implements [backend.KeyLister] as [Store.Stats] does.
func (d *DBStore) Stats(ctx context.Context) (backend.Stats, error) { return d.s.Stats(ctx) }

// AdmitQuota implements [backend.QuotaCounter] as [Store.AdmitQuota] does.
func (d *DBStore) AdmitQuota(ctx context.Context, q backend.QuotaCheck) (backend.QuotaAdmission, error) {
	return d.s.AdmitQuota(ctx, q)
}

// EndQuota implements [backend.QuotaCounter] as [Store.EndQuota] does.
func (d *DBStore) EndQuota(ctx context.Context, e backend.QuotaEnd) error {
	return d.s.EndQuota(ctx, e)
}

// PurgeQuota implements [backend.QuotaCounter] as [Store.PurgeQuota] does.
func (d *DBStore) PurgeQuota(ctx context.Context, limit int) (int, error) {
	return d.s.PurgeQuota(ctx, limit)
}

// CheckSchema implements [backend.SchemaChecker] as [Store.CheckSchema] does.
func (d *DBStore) CheckSchema(ctx context.Context, c backend.SchemaCheck) error {
	return d.s.CheckSchema(ctx, c)
}

// Migrate creates the table as [Store.Migrate] does.
func (d *DBStore) Migrate(ctx context.Context) error { return d.s.Migrate(ctx) }

// Schema returns the DDL of the store's table; see the package-level [Schema].
func (d *DBStore) Schema() string { return d.s.Schema() }

// IsConflict implements [backend.ConflictClassifier] as
// [Store.IsConflict] does, for the errors of pgx's stdlib driver and of
// lib/pq alike.
func (d *DBStore) IsConflict(err error) bool { return d.s.IsConflict(err) }

// sqlTxn is a reservation of [DBStore], whose fn gets the *sql.Tx.
type sqlTxn struct{ *txn }

func (t sqlTxn) Tx() *sql.Tx { return t.l.(*sqlLink).tx }

// sqlPhase is a phase of [DBStore], whose fn gets the *sql.Tx.
type sqlPhase struct{ *phase }

func (p sqlPhase) Tx() *sql.Tx { return p.l.(*sqlLink).tx }
