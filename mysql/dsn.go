package mysql

import (
	"database/sql"
	"fmt"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
)

// Open checks dsn with [CheckDSN] and opens a pool on it with the
// go-sql-driver/mysql connector. Like [sql.Open] it does not connect. A
// [Store] on a pool of Open costs two round trips fewer per new key on
// MariaDB (see "Round trips" in the package documentation); the pool is
// otherwise the driver's.
//
// Unless dsn sets interpolateParams itself, Open turns it on (when the
// driver allows it with dsn's collation): a statement with arguments is
// then one round trip instead of two (prepare, execute), for the store and
// for fn's statements alike. Write interpolateParams=false to keep
// server-side prepared statements.
func Open(dsn string) (*sql.DB, error) {
	cfg, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	if !setsParam(dsn, "interpolateParams") {
		on := cfg.Clone()
		on.InterpolateParams = true
		if c, err := gomysql.NewConnector(on); err == nil {
			return sql.OpenDB(&connector{inner: c, interpolate: true}), nil
		}
		// The driver refuses interpolation with some collations (big5,
		// sjis and the like): keep the DSN as it is.
	}
	c, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: mysql DSN: %w", idempotency.ErrInvalidConfig, err)
	}
	return sql.OpenDB(&connector{inner: c, interpolate: cfg.InterpolateParams}), nil
}

// setsParam reports whether dsn's parameters (after its last '?') name
// param.
func setsParam(dsn, param string) bool {
	i := strings.LastIndexByte(dsn, '?')
	if i < 0 {
		return false
	}
	for kv := range strings.SplitSeq(dsn[i+1:], "&") {
		if k, _, _ := strings.Cut(kv, "="); k == param {
			return true
		}
	}
	return false
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
