package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/go-idempotency/idempotency/postgres"
)

// openPostgres wires the PostgreSQL store, in tables unique to this run.
//
// With viaSQL (a postgres+sql:// value) the library version runs on the
// store on database/sql (postgres.NewDB, pgx's stdlib driver), its fn on
// the *sql.Tx; the naive version and the tables are the same.
func openPostgres(ctx context.Context, cfg *pgxpool.Config, naiveConns int, viaSQL bool) (b *backend, err error) {
	pool, err := openPool(ctx, cfg, poolSize)
	if err != nil {
		return nil, err
	}
	naivePool, err := openPool(ctx, cfg, naiveConns)
	if err != nil {
		pool.Close()
		return nil, err
	}
	payments, naiveKeys, keys := tableNames()
	closeAll := func(ctx context.Context) error {
		defer pool.Close()
		defer naivePool.Close()
		// The store's Migrate made keys and its quota table (keys + "_quota").
		if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS `+payments+`, `+naiveKeys+`, `+keys+`, `+keys+`_quota`); err != nil {
			return fmt.Errorf("postgres: drop tables: %w", err)
		}
		return nil
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, closeAll(context.WithoutCancel(ctx)))
		}
	}()

	store, err := postgres.New(pool, &postgres.Config{Table: keys})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	_, err = pool.Exec(ctx, `CREATE TABLE `+payments+` (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, source TEXT NOT NULL, order_id BIGINT NOT NULL, amount INT NOT NULL);
CREATE TABLE `+naiveKeys+` (idem_key TEXT NOT NULL, status INT NOT NULL, body TEXT NOT NULL)`)
	if err != nil {
		return nil, fmt.Errorf("postgres: create tables: %w", err)
	}

	insert := `INSERT INTO ` + payments + ` (source, order_id, amount) VALUES ($1, $2, $3) RETURNING id`
	lookup := `SELECT status, body FROM ` + naiveKeys + ` WHERE idem_key = $1 LIMIT 1`
	if err := errors.Join(warmPool(ctx, pool, poolSize, `SELECT 1`), warmPool(ctx, naivePool, naiveConns, lookup, "")); err != nil {
		return nil, err
	}
	naive := naiveOps{
		lookup: func(ctx context.Context, key string) (int, []byte, bool, error) {
			var status int
			var body string
			err := naivePool.QueryRow(ctx, lookup, key).Scan(&status, &body)
			if errors.Is(err, pgx.ErrNoRows) {
				return 0, nil, false, nil
			}
			return status, []byte(body), err == nil, err
		},
		pay: func(ctx context.Context, orderID, amount int) (string, error) {
			var id int64
			err := naivePool.QueryRow(ctx, insert, "naive", orderID, amount).Scan(&id)
			return strconv.FormatInt(id, 10), err
		},
		save: func(ctx context.Context, key string, status int, body []byte) error {
			_, err := naivePool.Exec(ctx, `INSERT INTO `+naiveKeys+` (idem_key, status, body) VALUES ($1, $2, $3)`, key, status, string(body))
			return err
		},
	}
	pay := func(ctx context.Context, tx pgx.Tx, orderID, amount int) (string, error) {
		var id int64
		err := tx.QueryRow(ctx, insert, "library", orderID, amount).Scan(&id)
		return strconv.FormatInt(id, 10), err
	}
	paymentIDs := func(source string) func(context.Context) ([]string, error) {
		return func(ctx context.Context) ([]string, error) {
			rows, err := pool.Query(ctx, `SELECT id FROM `+payments+` WHERE source = $1 ORDER BY id`, source)
			if err != nil {
				return nil, err
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			out := make([]string, len(ids))
			for i, id := range ids {
				out[i] = strconv.FormatInt(id, 10)
			}
			return out, err
		}
	}
	library := func(ctx context.Context, n int) (outcome, error) {
		return runLibrary[pgx.Tx](ctx, store, pay, n, paymentIDs("library"))
	}
	name := "postgres"
	if viaSQL {
		db := stdlib.OpenDB(*cfg.ConnConfig)
		closePools := closeAll
		closeAll = func(ctx context.Context) error { return errors.Join(closePools(ctx), db.Close()) }
		sqlStore, err := postgres.NewDB(db, &postgres.Config{Table: keys})
		if err != nil {
			return nil, err
		}
		if err := sizeSQL(ctx, db, poolSize, `SELECT 1`); err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		paySQL := func(ctx context.Context, tx *sql.Tx, orderID, amount int) (string, error) {
			var id int64
			err := tx.QueryRowContext(ctx, insert, "library", orderID, amount).Scan(&id)
			return strconv.FormatInt(id, 10), err
		}
		library = func(ctx context.Context, n int) (outcome, error) {
			return runLibrary[*sql.Tx](ctx, sqlStore, paySQL, n, paymentIDs("library"))
		}
		name = "postgres+sql"
	}
	return &backend{
		name:  name,
		where: fmt.Sprintf("PostgreSQL %s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database),
		naive: func(ctx context.Context, n int) (outcome, error) {
			return runNaive(ctx, naive, n, paymentIDs("naive"))
		},
		library: library,
		close:   closeAll,
	}, nil
}

// openPool opens a pool of at most size connections.
func openPool(ctx context.Context, cfg *pgxpool.Config, size int) (*pgxpool.Pool, error) {
	cfg = cfg.Copy()
	cfg.MaxConns = int32(size)
	cfg.MinConns = 0
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return pool, nil
}

// warmPool opens all size connections of pool at once and runs query on
// each, as the connections of a running server have. So no caller released
// by the start gate waits for a dial or a cold first query.
func warmPool(ctx context.Context, pool *pgxpool.Pool, size int, query string, args ...any) error {
	conns := make([]*pgxpool.Conn, 0, size)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range size {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("postgres: warming the pool: %w", err)
		}
		conns = append(conns, c)
		if _, err := c.Exec(ctx, query, args...); err != nil {
			return fmt.Errorf("postgres: warming the pool: %w", err)
		}
	}
	return nil
}
