package conformance_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/sqlite"
)

// twoTxStore is a backend split over three transactions, on SQLite: the key is
// reserved by its own committed INSERT, fn's effect runs in a second
// transaction, and the key is completed by a third statement once the
// effect has committed. Each step is correct on its own, and it passes the
// happy-path cases; but a Complete interrupted between the effect's commit
// and the key's completion leaves an effect without its answer, and the
// retry runs fn again. The suite must fail it (CompleteInterrupted).
type twoTxStore struct {
	db    *sql.DB
	table string
	now   func() time.Time // the store's clock
}

func (s *twoTxStore) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*sql.Tx], *backend.Record, error) {
	deadline := time.Now().Add(r.Wait)
	for {
		// 1. The reservation: its own committed statement, taking over an
		// expired row.
		now := s.now()
		res, err := s.db.ExecContext(ctx, `INSERT INTO `+s.table+` (scope, id, fp, state, created, expires)
VALUES (?, ?, ?, 'pending', ?, ?)
ON CONFLICT (scope, id) DO UPDATE SET fp = excluded.fp, state = 'pending', status = NULL, header = NULL, body = NULL,
	created = excluded.created, expires = excluded.expires
WHERE expires <= ?`, r.Key.Scope, r.Key.ID, r.Fingerprint, now.UnixNano(), backend.Expiry(now, r.TTL).UnixNano(), now.UnixNano())
		if err != nil {
			return nil, nil, busy(err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			// 2. fn's effect: a transaction of its own.
			tx, err := s.db.BeginTx(ctx, nil)
			if err != nil {
				s.release(ctx, r.Key)
				return nil, nil, busy(err)
			}
			return &twoTxTxn{s: s, tx: tx, r: r}, nil, nil
		}
		rec, err := s.read(ctx, r.Key)
		if err != nil || rec != nil {
			return nil, rec, err
		}
		if !time.Now().Before(deadline) {
			return nil, nil, fmt.Errorf("%w: twotx: key %v is pending", idempotency.ErrInProgress, r.Key)
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// read returns the key's record if it is completed (nil if it is pending).
func (s *twoTxStore) read(ctx context.Context, key idempotency.Key) (*backend.Record, error) {
	var (
		fp, state        string
		status           sql.NullInt64
		header, body     []byte
		created, expires int64
	)
	err := s.db.QueryRowContext(ctx, `SELECT fp, state, status, header, body, created, expires FROM `+s.table+
		` WHERE scope = ? AND id = ?`, key.Scope, key.ID).Scan(&fp, &state, &status, &header, &body, &created, &expires)
	if errors.Is(err, sql.ErrNoRows) || state == "pending" {
		return nil, nil
	}
	if err != nil {
		return nil, busy(err)
	}
	h, err := backend.UnmarshalHeader(header)
	if err != nil {
		return nil, err
	}
	return &backend.Record{Key: key, Fingerprint: fp, Status: int(status.Int64), Header: h, Body: body,
		CreatedAt: time.Unix(0, created), ExpiresAt: time.Unix(0, expires)}, nil
}

// release frees a pending key, as a careful author would after a failure.
func (s *twoTxStore) release(ctx context.Context, key idempotency.Key) {
	_, _ = s.db.ExecContext(context.WithoutCancel(ctx), `DELETE FROM `+s.table+` WHERE scope = ? AND id = ? AND state = 'pending'`, key.Scope, key.ID)
}

func (s *twoTxStore) Purge(ctx context.Context, limit int) (int, error) {
	before := s.now()
	res, err := s.db.ExecContext(ctx, `DELETE FROM `+s.table+` WHERE rowid IN (SELECT rowid FROM `+s.table+
		` WHERE state = 'completed' AND expires <= ? LIMIT ?)`, before.UnixNano(), limit)
	if err != nil {
		return 0, busy(err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

type twoTxTxn struct {
	s  *twoTxStore
	tx *sql.Tx
	r  backend.Reservation
}

func (t *twoTxTxn) Tx() *sql.Tx { return t.tx }

func (t *twoTxTxn) Complete(ctx context.Context, resp idempotency.Response) error {
	expiresAt := backend.Expiry(t.s.now(), t.r.TTL)
	// A careful author: a Complete called with a done ctx commits nothing
	// (so the store passes CompleteWithCancelledContext).
	if err := ctx.Err(); err != nil {
		_ = t.tx.Rollback()
		t.s.release(ctx, t.r.Key)
		return err
	}
	// 2'. The effect commits...
	if err := t.tx.Commit(); err != nil {
		t.s.release(ctx, t.r.Key)
		return busy(err)
	}
	// 3. ... then the key is completed by a statement of its own.
	_, err := t.s.db.ExecContext(ctx, `UPDATE `+t.s.table+` SET state = 'completed', status = ?, header = ?, body = ?, expires = ?
WHERE scope = ? AND id = ?`, resp.Status, backend.MarshalHeader(resp.Header), resp.Body, expiresAt.UnixNano(), t.r.Key.Scope, t.r.Key.ID)
	if err != nil {
		t.s.release(ctx, t.r.Key)
		return busy(err)
	}
	return nil
}

func (t *twoTxTxn) Rollback(ctx context.Context) error {
	err := t.tx.Rollback()
	t.s.release(ctx, t.r.Key)
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

// busy reports SQLite's busy database as a conflict to retry.
func busy(err error) error {
	if strings.Contains(err.Error(), "SQLITE_BUSY") || strings.Contains(err.Error(), "database is locked") {
		return fmt.Errorf("%w: %w", backend.ErrConflict, err)
	}
	return err
}

// twoTxHarness builds a fresh SQLite database per case for twoTxStore.
func twoTxHarness() conformance.Harness[*sql.Tx] {
	return conformance.Harness[*sql.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*sql.Tx] {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "twotx.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			if opts.MaxConns > 0 {
				db.SetMaxOpenConns(opts.MaxConns)
			}
			table := testkit.Name("keys_")
			if _, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (scope TEXT NOT NULL, id TEXT NOT NULL, fp TEXT NOT NULL,
state TEXT NOT NULL, status INTEGER, header BLOB, body BLOB, created INTEGER NOT NULL, expires INTEGER NOT NULL,
PRIMARY KEY (scope, id)); CREATE TABLE effects (tag TEXT NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			fx := testkit.Effects{DB: db, Table: "effects"}
			return conformance.Fixture[*sql.Tx]{Store: &twoTxStore{db: db, table: table, now: clockOr(opts.Clock)}, Effect: fx.Effect, Count: fx.Count}
		},
		Features: conformance.Features{SerialWriters: true},
	}
}

// clockOr is clk, or the host's clock when clk is nil (no test clock).
func clockOr(clk func() time.Time) func() time.Time {
	if clk != nil {
		return clk
	}
	return time.Now
}
