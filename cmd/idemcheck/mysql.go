package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/go-idempotency/idempotency/mysql"
)

// openMySQL wires the MySQL/MariaDB store, in tables unique to this run.
// dsn has been checked by mysql.ParseDSN.
func openMySQL(ctx context.Context, dsn string, naiveConns int) (b *backend, err error) {
	db, err := mysql.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	naiveDB, err := mysql.Open(ctx, dsn)
	if err != nil {
		return nil, errors.Join(err, db.Close())
	}
	payments, naiveKeys, keys := tableNames()
	t := sqlTables{db: db, naiveDB: naiveDB, payments: payments, naiveKeys: naiveKeys, keys: keys}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.close(context.WithoutCancel(ctx)))
		}
	}()

	store, err := mysql.New(db, &mysql.Config{Table: keys})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	if err := t.create(ctx,
		`id BIGINT AUTO_INCREMENT PRIMARY KEY, source VARCHAR(16) NOT NULL, order_id BIGINT NOT NULL, amount INT NOT NULL`,
		`idem_key VARCHAR(255) NOT NULL, status INT NOT NULL, body TEXT NOT NULL`,
	); err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	if err := errors.Join(sizeSQL(ctx, db, poolSize, `SELECT 1`), sizeSQL(ctx, naiveDB, naiveConns, t.warmQuery())); err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	where := "MySQL"
	if cfg, err := mysql.ParseDSN(dsn); err == nil {
		where = "MySQL " + cfg.Addr + "/" + cfg.DBName
	}
	return &backend{
		name:  "mysql",
		where: where,
		naive: func(ctx context.Context, n int) (outcome, error) {
			return runNaive(ctx, t.naive(), n, t.paymentIDs("naive"))
		},
		library: func(ctx context.Context, n int) (outcome, error) {
			return runLibrary[*sql.Tx](ctx, store, t.pay, n, t.paymentIDs("library"))
		},
		close: t.close,
	}, nil
}
