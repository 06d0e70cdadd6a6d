package mysql

import (
	"database/sql"
	"fmt"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
)

// Open checks dsn with [CheckDSN] and opens a pool on it with the
// go-sql-driver/mysql connector. Like [sql.Open] it does not connect.
func Open(dsn string) (*sql.DB, error) {
	cfg, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	c, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: mysql DSN: %w", idempotency.ErrInvalidConfig, err)
	}
	return sql.OpenDB(c), nil
}

// CheckDSN parses dsn with the driver's ParseDSN and refuses, with an error
// wrapping [idempotency.ErrInvalidConfig], the settings that break the
// store:
//
//   - no database name: the store's SQL names its table without one;
//   - autocommit turned off as a session variable (autocommit=0): the
//     lookups and probes the store runs outside any transaction would open
//     transactions that outlive them, with their snapshots and locks;
//   - transaction_isolation or tx_isolation READ-UNCOMMITTED: the lookup
//     outside a transaction could return a response whose transaction then
//     fails to commit.
//
// Everything else is accepted: parseTime, loc, clientFoundRows,
// interpolateParams, multiStatements, charset and collation make no
// difference to the store. See the package documentation for settings that
// bound what it can do (readTimeout, maxAllowedPacket).
func CheckDSN(dsn string) error {
	_, err := parseDSN(dsn)
	return err
}

func parseDSN(dsn string) (*gomysql.Config, error) {
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: mysql DSN: %w", idempotency.ErrInvalidConfig, err)
	}
	if cfg.DBName == "" {
		return nil, fmt.Errorf("%w: mysql DSN names no database (user@tcp(host:3306)/dbname)", idempotency.ErrInvalidConfig)
	}
	for param, raw := range cfg.Params {
		name := strings.TrimPrefix(strings.ToLower(param), "@@")
		name = strings.TrimPrefix(strings.TrimPrefix(name, "session."), "local.")
		value := strings.ToUpper(strings.Trim(raw, "'\"` "))
		switch name {
		case "autocommit":
			if value == "0" || value == "OFF" || value == "FALSE" {
				return nil, fmt.Errorf("%w: mysql DSN sets autocommit=%s; the store needs autocommit on outside its transactions",
					idempotency.ErrInvalidConfig, raw)
			}
		case "transaction_isolation", "tx_isolation":
			if strings.ReplaceAll(value, " ", "-") == "READ-UNCOMMITTED" {
				return nil, fmt.Errorf("%w: mysql DSN sets %s to READ UNCOMMITTED; the store needs READ COMMITTED or stronger",
					idempotency.ErrInvalidConfig, param)
			}
		}
	}
	return cfg, nil
}
