package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redact"
)

// Open parses dsn with [ParseDSN], opens a pool on it with the
// go-sql-driver/mysql connector and pings the server under ctx. A bad DSN
// is refused with an error wrapping [idempotency.ErrInvalidConfig] before
// anything is sent; a failed ping closes the pool and is returned. A
// [Store] on a pool of Open costs two round trips fewer per new key on
// MariaDB (see "Round trips" in the package documentation); the pool is
// otherwise the driver's. The caller closes the returned *sql.DB.
//
// Unless dsn sets interpolateParams itself, Open turns it on (when the
// driver allows it with dsn's collation). A statement with arguments is
// then one round trip instead of two (prepare, execute). This holds for
// the store and for fn's statements alike. Write interpolateParams=false
// to keep server-side prepared statements.
func Open(ctx context.Context, dsn string) (*sql.DB, error) {
	db, err := openPool(dsn)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("mysql: open: %w", err), db.Close())
	}
	return db, nil
}

// openPool is Open without the ping: like [sql.Open] it does not connect.
func openPool(dsn string) (*sql.DB, error) {
	cfg, err := ParseDSN(dsn)
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

// ParseDSN parses dsn, in the driver's form (user:pass@tcp(host:3306)/db)
// or as a URL (mysql://user:pass@host:3306/db, port 3306 by default), into
// the driver's configuration. It refuses, with an error wrapping
// [idempotency.ErrInvalidConfig], a malformed DSN and the settings that
// break the store:
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
//
// An error never holds dsn's password.
func ParseDSN(dsn string) (*gomysql.Config, error) {
	cfg, err := parseDSN(dsn)
	return cfg, redact.Error(err, dsn)
}

func parseDSN(dsn string) (*gomysql.Config, error) {
	if strings.HasPrefix(dsn, urlScheme) {
		return parseURL(dsn)
	}
	if scheme := otherScheme(dsn); scheme != "" {
		return nil, fmt.Errorf("%w: mysql DSN: a %s:// URL is %s, not a MySQL DSN; write mysql://user:pass@host:3306/db or user:pass@tcp(host:3306)/db",
			idempotency.ErrInvalidConfig, scheme, schemeStore(scheme))
	}
	return checkConfig(gomysql.ParseDSN(dsn))
}

// otherScheme returns the scheme of a URL that is not mysql://, or "".
func otherScheme(dsn string) string {
	scheme, _, ok := strings.Cut(dsn, "://")
	if !ok || scheme == "" {
		return ""
	}
	for i, c := range scheme {
		letter := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		if !letter && (i == 0 || !('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return ""
		}
	}
	return scheme
}

// schemeStore names what a URL of scheme is, for otherScheme's error.
func schemeStore(scheme string) string {
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		return "a PostgreSQL URL (use the postgres package)"
	case "redis", "rediss":
		return "a Redis URL (use the redis package)"
	}
	return "another kind of URL"
}

// urlScheme starts a DSN in the URL form.
const urlScheme = "mysql://"

// parseURL translates mysql://user:pass@host:port/db?params into the
// driver's configuration, then checks it as ParseDSN does.
func parseURL(dsn string) (*gomysql.Config, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: mysql DSN: %w", idempotency.ErrInvalidConfig, err)
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("%w: mysql DSN: the URL names no host", idempotency.ErrInvalidConfig)
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, fmt.Errorf("%w: mysql DSN: want one database name in the URL's path, got %q", idempotency.ErrInvalidConfig, u.Path)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	// The driver parses the parameters (and refuses unknown values). The
	// database name goes in the config, not the text: it may hold any byte.
	text := "tcp(" + addr + ")/"
	if u.RawQuery != "" {
		text += "?" + u.RawQuery
	}
	cfg, err := gomysql.ParseDSN(text)
	if err == nil {
		cfg.DBName = db
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	return checkConfig(cfg, err)
}

// checkConfig refuses a driver configuration that breaks the store, or the
// parser's error, as ParseDSN says.
func checkConfig(cfg *gomysql.Config, err error) (*gomysql.Config, error) {
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
