package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
)

// sqlTables are the run's tables in a database/sql database (SQLite or
// MySQL, both with ? placeholders and LastInsertId).
type sqlTables struct {
	db        *sql.DB // the library's pool; also creates, counts and drops
	naiveDB   *sql.DB // the naive version's pool
	payments  string  // payments of both versions, told apart by source
	naiveKeys string  // the naive version's keys: no unique constraint
	keys      string  // the library's keys table (its Config.Table)
}

// tableNames returns the run's table names, unique per run.
func tableNames() (payments, naiveKeys, keys string) {
	p := "idemcheck_" + randomID()[:8] + "_"
	return p + "payments", p + "naive_keys", p + "keys"
}

// warmQuery is the naive version's lookup of a key that does not exist.
func (s sqlTables) warmQuery() string {
	return `SELECT status, body FROM ` + s.naiveKeys + ` WHERE idem_key = '' LIMIT 1`
}

// naive is the check-then-write version on naiveDB: each step is its own
// statement, in its own (autocommit) transaction.
func (s sqlTables) naive() naiveOps {
	return naiveOps{
		lookup: func(ctx context.Context, key string) (int, []byte, bool, error) {
			var status int
			var body []byte
			err := s.naiveDB.QueryRowContext(ctx, `SELECT status, body FROM `+s.naiveKeys+` WHERE idem_key = ? LIMIT 1`, key).Scan(&status, &body)
			if errors.Is(err, sql.ErrNoRows) {
				return 0, nil, false, nil
			}
			return status, body, err == nil, err
		},
		pay: func(ctx context.Context, orderID, amount int) (string, error) {
			return insertPayment(ctx, s.naiveDB, s.payments, "naive", orderID, amount)
		},
		save: func(ctx context.Context, key string, status int, body []byte) error {
			_, err := s.naiveDB.ExecContext(ctx, `INSERT INTO `+s.naiveKeys+` (idem_key, status, body) VALUES (?, ?, ?)`, key, status, string(body))
			return err
		},
	}
}

// pay inserts one payment of the library version through tx.
func (s sqlTables) pay(ctx context.Context, tx *sql.Tx, orderID, amount int) (string, error) {
	return insertPayment(ctx, tx, s.payments, "library", orderID, amount)
}

// create creates the payments table and the naive version's keys table.
func (s sqlTables) create(ctx context.Context, paymentsDDL, naiveKeysDDL string) error {
	for _, ddl := range []string{
		`CREATE TABLE ` + s.payments + ` (` + paymentsDDL + `)`,
		`CREATE TABLE ` + s.naiveKeys + ` (` + naiveKeysDDL + `)`,
	} {
		if _, err := s.db.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("create tables: %w", err)
		}
	}
	return nil
}

// paymentIDs returns the ids of the payments of one version.
func (s sqlTables) paymentIDs(source string) func(context.Context) ([]string, error) {
	return func(ctx context.Context) ([]string, error) {
		rows, err := s.db.QueryContext(ctx, `SELECT id FROM `+s.payments+` WHERE source = ? ORDER BY id`, source)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var ids []string
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return nil, err
			}
			ids = append(ids, strconv.FormatInt(id, 10))
		}
		return ids, rows.Err()
	}
}

// close drops the run's tables, all of them even if one fails, and closes
// both pools.
func (s sqlTables) close(ctx context.Context) error {
	var errs []error
	// The store's Migrate made keys and its quota table (keys + "_quota").
	for _, t := range []string{s.payments, s.naiveKeys, s.keys, s.keys + "_quota"} {
		if _, err := s.db.ExecContext(ctx, `DROP TABLE IF EXISTS `+t); err != nil {
			errs = append(errs, fmt.Errorf("drop %s: %w", t, err))
		}
	}
	errs = append(errs, s.naiveDB.Close(), s.db.Close())
	return errors.Join(errs...)
}

// execer is *sql.DB or *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func insertPayment(ctx context.Context, db execer, table, source string, orderID, amount int) (string, error) {
	res, err := db.ExecContext(ctx, `INSERT INTO `+table+` (source, order_id, amount) VALUES (?, ?, ?)`, source, orderID, amount)
	if err != nil {
		return "", err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(id, 10), nil
}

// sizeSQL caps db's pool at n connections, opens all n at once and runs
// query on each, as the connections of a running server have. So no caller
// released by the start gate waits for a dial or a cold first query.
func sizeSQL(ctx context.Context, db *sql.DB, n int, query string) error {
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			return fmt.Errorf("warming the pool: %w", err)
		}
		conns = append(conns, c)
		if _, err := c.ExecContext(ctx, query); err != nil {
			return fmt.Errorf("warming the pool: %w", err)
		}
	}
	return nil
}
