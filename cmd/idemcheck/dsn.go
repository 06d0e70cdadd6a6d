package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency/mysql"
)

// target is a parsed -store value. Exactly one of its store fields is set
// (or none, for the default temporary SQLite database).
type target struct {
	kind   string // "sqlite", "postgres", "mysql" or "redis"
	sqlite string // SQLite file path; "" means a temporary database
	pg     *pgxpool.Config
	my     string // go-sql-driver/mysql DSN, checked by mysql.CheckDSN
	rd     *goredis.Options
}

// parseStore turns a -store value into a target, without connecting.
func parseStore(dsn string) (target, error) {
	if dsn == "" {
		return target{kind: "sqlite"}, nil
	}
	scheme, _, hasScheme := strings.Cut(dsn, "://")
	switch {
	case hasScheme && (scheme == "postgres" || scheme == "postgresql"):
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return target{}, fmt.Errorf("postgres DSN: %w", err)
		}
		return target{kind: "postgres", pg: cfg}, nil
	case hasScheme && scheme == "mysql":
		cfg, err := parseMySQLURL(dsn)
		if err != nil {
			return target{}, err
		}
		return mysqlTarget(cfg.FormatDSN())
	case hasScheme && (scheme == "redis" || scheme == "rediss"):
		opt, err := goredis.ParseURL(dsn)
		if err != nil {
			return target{}, fmt.Errorf("redis DSN: %w", err)
		}
		return target{kind: "redis", rd: opt}, nil
	case hasScheme:
		return target{}, fmt.Errorf("unknown scheme %q (want postgres://, postgresql://, mysql://, redis://, sqlite:PATH or a file path)", scheme)
	case strings.HasPrefix(dsn, "sqlite:"):
		path := strings.TrimPrefix(dsn, "sqlite:")
		if path == "" {
			return target{}, errors.New("sqlite: the path is empty")
		}
		return target{kind: "sqlite", sqlite: path}, nil
	case looksLikeMySQLNative(dsn):
		return mysqlTarget(dsn)
	}
	return target{kind: "sqlite", sqlite: dsn}, nil
}

// mysqlTarget checks a driver DSN with the mysql package's own rules.
func mysqlTarget(dsn string) (target, error) {
	if err := mysql.CheckDSN(dsn); err != nil {
		return target{}, err
	}
	return target{kind: "mysql", my: dsn}, nil
}

// looksLikeMySQLNative reports whether dsn is in go-sql-driver/mysql's own
// form, user[:pass]@net(addr)/db, rather than a file path.
func looksLikeMySQLNative(dsn string) bool {
	at := strings.LastIndex(dsn, "@")
	if at < 0 {
		return false
	}
	rest := dsn[at+1:]
	open := strings.Index(rest, "(")
	return open > 0 && strings.Contains(rest[open:], ")/")
}

// parseMySQLURL translates mysql://user:pass@host:port/db?params into the
// driver's configuration.
func parseMySQLURL(dsn string) (*gomysql.Config, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysql DSN: %w", err)
	}
	if u.Host == "" {
		return nil, errors.New("mysql DSN: no host")
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, fmt.Errorf("mysql DSN: want one database name in the path, got %q", u.Path)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	// The driver parses the parameters (and refuses unknown values).
	cfg, err := gomysql.ParseDSN("tcp(" + addr + ")/" + db + "?" + u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("mysql DSN: %w", err)
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	return cfg, nil
}
