package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/go-idempotency/idempotency/sqlite"
)

// openSQLite wires the SQLite store: on the file at path, or on a temporary
// database when path is empty. The backend's close removes a database file
// that the run created. From a file that existed, it removes only the
// run's tables.
func openSQLite(ctx context.Context, path string, naiveConns int) (b *backend, err error) {
	where := "SQLite " + path
	removeDir := func() error { return nil }
	if _, err := os.Stat(path); path != "" && errors.Is(err, fs.ErrNotExist) {
		removeDir = func() error {
			var errs []error
			for _, f := range []string{path, path + "-wal", path + "-shm", path + "-journal"} {
				if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		}
	}
	if path == "" {
		dir, err := os.MkdirTemp("", "idemcheck-")
		if err != nil {
			return nil, err
		}
		path = filepath.Join(dir, "idemcheck.db")
		where = "a temporary SQLite database"
		removeDir = func() error { return os.RemoveAll(dir) }
	}
	db, err := sqlite.Open(ctx, path)
	if err != nil {
		return nil, errors.Join(err, removeDir())
	}
	naiveDB, err := sqlite.Open(ctx, path)
	if err != nil {
		return nil, errors.Join(err, db.Close(), removeDir())
	}
	payments, naiveKeys, keys := tableNames()
	t := sqlTables{db: db, naiveDB: naiveDB, payments: payments, naiveKeys: naiveKeys, keys: keys}
	closeAll := func(ctx context.Context) error {
		return errors.Join(t.close(ctx), removeDir())
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, closeAll(context.WithoutCancel(ctx)))
		}
	}()

	store, err := sqlite.New(db, &sqlite.Config{Table: keys})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	if err := t.create(ctx,
		`id INTEGER PRIMARY KEY AUTOINCREMENT, source TEXT NOT NULL, order_id INTEGER NOT NULL, amount INTEGER NOT NULL`,
		`idem_key TEXT NOT NULL, status INTEGER NOT NULL, body TEXT NOT NULL`,
	); err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	if err := errors.Join(sizeSQL(ctx, db, poolSize, `SELECT 1`), sizeSQL(ctx, naiveDB, naiveConns, t.warmQuery())); err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	return &backend{
		name:  "sqlite",
		where: where,
		naive: func(ctx context.Context, n int) (outcome, error) {
			return runNaive(ctx, t.naive(), n, t.paymentIDs("naive"))
		},
		library: func(ctx context.Context, n int) (outcome, error) {
			return runLibrary[*sql.Tx](ctx, store, t.pay, n, t.paymentIDs("library"))
		},
		close: closeAll,
	}, nil
}
