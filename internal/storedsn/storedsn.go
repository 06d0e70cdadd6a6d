// Package storedsn parses the -store values the commands accept
// (idemcheck, idemctl): one parser, so that every command takes the same
// forms and refuses the same mistakes.
package storedsn

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency/internal/redact"
	"github.com/go-idempotency/idempotency/mysql"
)

// The kinds of store a [Target] names.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
	MySQL    = "mysql"
	Redis    = "redis"
)

// Target is a parsed -store value. Exactly one of its store fields is set
// for its Kind.
type Target struct {
	Kind     string           // SQLite, Postgres, MySQL or Redis
	Path     string           // SQLite file path
	Postgres *pgxpool.Config  // PostgreSQL
	MySQL    string           // MySQL DSN in either form, checked by mysql.ParseDSN
	Redis    *goredis.Options // Redis

	// DatabaseSQL: the PostgreSQL store on database/sql (postgres.NewDB,
	// with pgx's stdlib driver), for a postgres+sql:// value.
	DatabaseSQL bool
}

// FlagHelp is the help of a -store flag.
const FlagHelp = "store `DSN`: postgres://... (postgres+sql://... for the store on database/sql), mysql://user:pass@host:port/db, user@tcp(host:port)/db, redis://host:port/db, sqlite:PATH, file:PATH or a path ending in .db, .sqlite or .sqlite3"

// Accepted lists the -store forms, for a command's help and for the error
// that refuses anything else.
const Accepted = `accepted -store values:
  PATH.db, PATH.sqlite, PATH.sqlite3   SQLite file
  sqlite:PATH, file:PATH               SQLite file of any name
  postgres://user@host:5432/db         PostgreSQL (also postgresql://; e.g. ?sslmode=disable)
  postgres+sql://user@host:5432/db     PostgreSQL, the store on database/sql (postgres.NewDB)
  mysql://user:pass@host:3306/db       MySQL/MariaDB (also user:pass@tcp(host:3306)/db)
  redis://host:6379/0                  Redis (also rediss:// for TLS)`

// Error is the error of a -store value that is not one of the accepted
// forms (or is one, but malformed). Its message lists the accepted forms.
type Error struct {
	Value  string // the -store value, secrets included: never print it
	Reason string // what is wrong with it
	Err    error  // the parser's error, if any
}

// Error says what is wrong with the value and lists the accepted forms.
// The value's password (and any other secret it holds) is redacted, in
// the value and in the parser's error alike.
func (e *Error) Error() string {
	msg := fmt.Sprintf("-store %q: %s", e.Value, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return redact.Text(msg, e.Value) + "\n" + Accepted
}

// Unwrap returns the parser's error.
func (e *Error) Unwrap() error { return e.Err }

// sqliteSuffixes are the file extensions taken as SQLite paths without a
// sqlite: or file: prefix.
var sqliteSuffixes = []string{".db", ".sqlite", ".sqlite3"}

// Parse turns a -store value into a Target, without connecting. A value
// that is not a recognised form, the empty one included, is refused with
// an [*Error]. It is never taken for a file name: `-store 127.0.0.1:6379`
// would otherwise run on a new SQLite file of that name.
func Parse(dsn string) (Target, error) {
	t, reason, err := classifyStore(dsn)
	if reason != "" || err != nil {
		return Target{}, &Error{Value: dsn, Reason: reason, Err: err}
	}
	return t, nil
}

// classifyStore parses dsn; a non-empty reason or an error refuses it.
func classifyStore(dsn string) (t Target, reason string, err error) {
	if dsn == "" {
		return Target{}, "empty", nil
	}
	scheme, _, hasScheme := strings.Cut(dsn, "://")
	switch {
	case hasScheme && (scheme == "postgres" || scheme == "postgresql" || scheme == "postgres+sql" || scheme == "postgresql+sql"):
		viaSQL := strings.HasSuffix(scheme, "+sql")
		if viaSQL {
			dsn = strings.TrimSuffix(scheme, "+sql") + dsn[len(scheme):]
		}
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return Target{}, "invalid PostgreSQL URL", err
		}
		return Target{Kind: Postgres, Postgres: cfg, DatabaseSQL: viaSQL}, "", nil
	case hasScheme && scheme == "mysql":
		t, err := mysqlTarget(dsn)
		if err != nil {
			return Target{}, "invalid MySQL URL", err
		}
		return t, "", nil
	case hasScheme && (scheme == "redis" || scheme == "rediss"):
		opt, err := goredis.ParseURL(dsn)
		if err != nil {
			return Target{}, "invalid Redis URL", err
		}
		return Target{Kind: Redis, Redis: opt}, "", nil
	case hasScheme && scheme == "file":
		path := strings.TrimPrefix(dsn, "file://")
		if !strings.HasPrefix(path, "/") {
			return Target{}, "a file:// URL must have an empty host and an absolute path (file:///dir/keys.db)", nil
		}
		return sqliteTarget(path)
	case hasScheme:
		return Target{}, fmt.Sprintf("unknown scheme %q", scheme), nil
	case strings.HasPrefix(dsn, "sqlite:"):
		return sqliteTarget(strings.TrimPrefix(dsn, "sqlite:"))
	case strings.HasPrefix(dsn, "file:"):
		return sqliteTarget(strings.TrimPrefix(dsn, "file:"))
	case looksLikeMySQLNative(dsn):
		t, err := mysqlTarget(dsn)
		if err != nil {
			return Target{}, "unusable MySQL DSN (the driver's form is USER:PASS@tcp(HOST:3306)/DB)", err
		}
		return t, "", nil
	}
	lower := strings.ToLower(dsn)
	for _, suf := range sqliteSuffixes {
		if strings.HasSuffix(lower, suf) && len(dsn) > len(suf) {
			return sqliteTarget(dsn)
		}
	}
	if strings.Contains(dsn, "@") {
		return Target{}, "USER@HOST without a scheme names no store; write mysql://USER:PASS@HOST:3306/DB, " +
			"postgres://USER:PASS@HOST:5432/DB or redis://USER:PASS@HOST:6379/0 " +
			"(or the MySQL driver's form USER:PASS@tcp(HOST:3306)/DB)", nil
	}
	if host, port, err := net.SplitHostPort(dsn); err == nil && host != "" && port != "" {
		return Target{}, "a bare host:port names no store; " + guessScheme(host, port), nil
	}
	return Target{}, "not a recognised store (a SQLite file path must end in .db, .sqlite or .sqlite3, or start with sqlite: or file:)", nil
}

// guessScheme suggests a URL for a bare host:port from its port.
func guessScheme(host, port string) string {
	addr := net.JoinHostPort(host, port)
	switch port {
	case "5432":
		return "for PostgreSQL write postgres://USER@" + addr + "/DB"
	case "3306":
		return "for MySQL write mysql://USER@" + addr + "/DB"
	case "6379":
		return "for Redis write redis://" + addr
	}
	return "write it as a URL with its scheme"
}

// sqliteTarget checks a SQLite file path given with sqlite:, file: or a
// recognised extension. The store opens it with its own options, so a
// query string is refused.
func sqliteTarget(path string) (Target, string, error) {
	switch {
	case path == "":
		return Target{}, "SQLite: the path is empty", nil
	case path == ":memory:":
		return Target{}, "SQLite: an in-memory database is not shared by the connections of a pool; give a file path", nil
	case strings.Contains(path, "?"):
		return Target{}, "SQLite: a query string is not accepted (the store sets its own options); give a plain file path", nil
	}
	return Target{Kind: SQLite, Path: path}, "", nil
}

// mysqlTarget checks a DSN, in the driver's form or the URL form, with
// the mysql package's own rules.
func mysqlTarget(dsn string) (Target, error) {
	if _, err := mysql.ParseDSN(dsn); err != nil {
		return Target{}, err
	}
	return Target{Kind: MySQL, MySQL: dsn}, nil
}

// looksLikeMySQLNative reports whether dsn is in go-sql-driver/mysql's own
// form, user[:pass]@net(addr)/db, rather than a file path: an '@' then a
// network name and '('. A DSN of that form with a mistake (a missing ')'
// or "/db") is one too, for the driver to say what is wrong with it.
func looksLikeMySQLNative(dsn string) bool {
	return mysqlNativeRE.MatchString(dsn)
}

// mysqlNativeRE matches the "@net(" of go-sql-driver/mysql's form.
var mysqlNativeRE = regexp.MustCompile(`@[a-z][a-z0-9]*\(`)

// FlagValues returns the values of the -store flags of a command line,
// whatever their position and spelling (-store V, --store V, -store=V):
// the DSNs whose secrets the command redacts from all it prints.
func FlagValues(args []string) []string {
	var vs []string
	for i, a := range args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "store" {
			continue
		}
		if hasValue {
			vs = append(vs, value)
		} else if i+1 < len(args) {
			vs = append(vs, args[i+1])
		}
	}
	return vs
}

// QuietRedis stops go-redis from printing log lines of its own on the
// process's stderr (its pool prints one for each dial that fails), which a
// command's user would read next to, and before, the command's own error
// that already carries the same cause. go-redis keeps its logger in a
// process-wide atomic value: only a command's run calls this.
func QuietRedis() { goredis.SetLogger(discardLog{}) }

// discardLog is a go-redis logger that prints nothing.
type discardLog struct{}

func (discardLog) Printf(context.Context, string, ...any) {}
