package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// phase is a transaction of [Store.Acquire] on one connection.
type phase struct {
	s        *Store
	conn     *sql.Conn
	tx       *sql.Tx
	key      key
	a        backend.Acquisition
	fp       string
	progress []byte
	tries    int
	done     bool
	// fold: the transaction's BeginTx was deferred (see foldConn), so
	// Complete can store the answer and commit in one statement.
	fold bool
}

// Tx returns the phase's transaction; the step's writes run on it.
func (p *phase) Tx() *sql.Tx { return p.tx }

// Fingerprint returns the fingerprint the operation started with.
func (p *phase) Fingerprint() string { return p.fp }

// Progress returns the progress last saved, nil for a new key.
func (p *phase) Progress() []byte { return p.progress }

// Tries returns how many runs released the key after a failure.
func (p *phase) Tries() int { return p.tries }

// Save commits the phase with progress and the owner's lease.
func (p *phase) Save(ctx context.Context, progress []byte) error {
	return p.commit(ctx, progress, false)
}

// Release commits the phase with progress, the lease ended now and one
// more try.
func (p *phase) Release(ctx context.Context, progress []byte) error {
	return p.commit(ctx, progress, true)
}

func (p *phase) commit(ctx context.Context, progress []byte, release bool) error {
	if p.done {
		return errEnded
	}
	p.done = true
	if err := checkProgress(p.key.key, progress); err != nil {
		p.end()
		return err
	}
	now, err := p.s.testNow()
	if err != nil {
		p.end()
		return err
	}
	k := p.key
	var res sql.Result
	if release {
		res, err = p.tx.ExecContext(ctx, p.s.steps.release, progress, now, p.tries+1, k.scope, k.id)
	} else {
		left, lease := ttlArgs(p.a.Lease)
		res, err = p.tx.ExecContext(ctx, p.s.steps.save, progress, p.a.Owner, now, left, lease, p.tries, k.scope, k.id)
	}
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil && n == 0 {
		// Nothing changed (the same progress and lease again, without the
		// DSN's clientFoundRows), or fn deleted the row: which?
		var one int
		if err = p.tx.QueryRowContext(ctx, p.s.steps.exists, k.scope, k.id).Scan(&one); errors.Is(err, sql.ErrNoRows) {
			err = errPendingGone
		}
	}
	if err != nil {
		p.end()
		return mapError(ctx, err, false, "mysql: save key %v", k.key)
	}
	err = p.tx.Commit()
	_ = p.conn.Close()
	return mapError(ctx, err, false, "mysql: commit key %v", k.key)
}

// Complete stores resp as the key's completed record and commits.
func (p *phase) Complete(ctx context.Context, resp idempotency.Response) error {
	if p.done {
		return errEnded
	}
	p.done = true
	now, err := p.s.testNow()
	if err != nil {
		p.end()
		return err
	}
	return completeRow(ctx, p.conn, p.tx, p.end, p.key, p.fold, p.s.steps.complete, p.s.steps.completeFold, resp, now, p.a.TTL)
}

// Rollback abandons the phase and releases the connection.
func (p *phase) Rollback(context.Context) error {
	if p.done {
		return nil
	}
	p.done = true
	if err := p.end(); err != nil {
		return fmt.Errorf("mysql: roll back key %v: %w", p.key.key, err)
	}
	return nil
}

// end rolls the transaction back and releases the connection (see
// txn.end).
func (p *phase) end() error {
	err := p.tx.Rollback()
	if err != nil && !errors.Is(err, sql.ErrTxDone) {
		discard(p.conn)
		return err
	}
	_ = p.conn.Close()
	return nil
}
