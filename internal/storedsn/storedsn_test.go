package storedsn

import (
	"errors"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency/mysql"
)

// TestStoreAccepted: every accepted -store form gives the right kind of
// store (and, for SQLite, the right path).
func TestStoreAccepted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ dsn, kind, path string }{
		{"keys.db", "sqlite", "keys.db"},
		{"./data/keys.sqlite", "sqlite", "./data/keys.sqlite"},
		{"/var/lib/app/KEYS.SQLITE3", "sqlite", "/var/lib/app/KEYS.SQLITE3"},
		{"sqlite:/tmp/any-name", "sqlite", "/tmp/any-name"},
		{"sqlite:relative/file", "sqlite", "relative/file"},
		{"file:/tmp/keys", "sqlite", "/tmp/keys"},
		{"file:keys.bin", "sqlite", "keys.bin"},
		{"file:///tmp/keys.db", "sqlite", "/tmp/keys.db"},
		{"postgres://u@h/db", "postgres", ""},
		{"postgresql://u:p@h:5433/db?sslmode=disable", "postgres", ""},
		{"mysql://root@127.0.0.1:3306/test", "mysql", ""},
		{"root@tcp(127.0.0.1:3306)/test", "mysql", ""},
		{"u:p@unix(/run/mysqld/mysqld.sock)/test", "mysql", ""},
		{"redis://127.0.0.1:6379", "redis", ""},
		{"redis://:secret@h:6380/2", "redis", ""},
		{"rediss://h:6380/0", "redis", ""},
	} {
		got, err := Parse(tc.dsn)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.dsn, err)
			continue
		}
		if got.Kind != tc.kind || got.Path != tc.path {
			t.Errorf("Parse(%q) = kind %q path %q, want %q %q", tc.dsn, got.Kind, got.Path, tc.kind, tc.path)
		}
	}
	if got, _ := Parse("rediss://h:6380/0"); got.Redis == nil || got.Redis.TLSConfig == nil {
		t.Errorf("rediss:// did not enable TLS: %+v", got.Redis)
	}
}

// TestStoreRefused: anything else is refused with an *Error whose
// message says what is wrong and lists the accepted forms; nothing falls
// back to a SQLite file named after the value.
func TestStoreRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		dsn  string
		want string // in the reason
	}{
		{"", "empty"},
		{"127.0.0.1:6379", "for Redis write redis://127.0.0.1:6379"},
		{"localhost:5432", "for PostgreSQL write postgres://USER@localhost:5432/DB"},
		{"db.internal:3306", "for MySQL write mysql://USER@db.internal:3306/DB"},
		{"10.0.0.7:9999", "write it as a URL with its scheme"},
		{"[::1]:6379", "for Redis write redis://[::1]:6379"},
		{"keys", "not a recognised store"},
		{"payments.json", "not a recognised store"},
		{".db", "not a recognised store"},
		{"ftp://host/db", `unknown scheme "ftp"`},
		{"http://127.0.0.1:6379", `unknown scheme "http"`},
		{"sqlite:", "the path is empty"},
		{"file:", "the path is empty"},
		{"sqlite::memory:", "in-memory"},
		{"file:keys.db?mode=ro", "query string"},
		{"keys.db?_pragma=x", "not a recognised store"},
		{"file://host/keys.db", "empty host"},
		{"postgres://user@host:notaport/db", "invalid PostgreSQL URL"},
		{"mysql://root@127.0.0.1:3306/", "invalid MySQL URL"},
		{"mysql://root@127.0.0.1:3306/test?parseTime=maybe", "invalid MySQL URL"},
		{"root@tcp(127.0.0.1:3306)/", "unusable MySQL DSN"},
		{"root@tcp(127.0.0.1:3306)/test?autocommit=0", "unusable MySQL DSN"},
		{"redis://127.0.0.1:6379/notadb", "invalid Redis URL"},
		// A MySQL DSN in the driver's form with a mistake is one, not a
		// "bare host:port".
		{"root@tcp(127.0.0.1:3306/test", "unusable MySQL DSN (the driver's form is USER:PASS@tcp(HOST:3306)/DB): " +
			"idempotency: invalid config: mysql DSN: invalid DSN: network address not terminated (missing closing brace)"},
		{"root:pw@tcp(127.0.0.1:3306", "unusable MySQL DSN"},
		{"root@127.0.0.1:3306", "USER@HOST without a scheme names no store; write mysql://USER:PASS@HOST:3306/DB"},
		{"root:pw@127.0.0.1:3306/test", "USER@HOST without a scheme"},
	} {
		_, err := Parse(tc.dsn)
		var se *Error
		if !errors.As(err, &se) {
			t.Errorf("Parse(%q): err = %v, want an *Error", tc.dsn, err)
			continue
		}
		if se.Value != tc.dsn || !strings.Contains(se.Error(), tc.want) {
			t.Errorf("Parse(%q): %q does not say %q", tc.dsn, se.Error(), tc.want)
		}
		for _, form := range []string{"postgres://", "mysql://", "tcp(host:3306)", "redis://", "rediss://", "sqlite:PATH", "file:PATH", ".sqlite3"} {
			if !strings.Contains(se.Error(), form) {
				t.Errorf("Parse(%q): message does not list %q:\n%s", tc.dsn, form, se.Error())
			}
		}
	}
}

// TestParse: the parsed Target carries what the store needs.
func TestParse(t *testing.T) {
	t.Parallel()
	for dsn, want := range map[string]gomysql.Config{
		"mysql://u:p%40ss@db.example:3307/shop?parseTime=true&timeout=5s": {
			User: "u", Passwd: "p@ss", Net: "tcp", Addr: "db.example:3307", DBName: "shop", ParseTime: true, Timeout: 5 * time.Second,
		},
		"mysql://root@localhost/test":                  {User: "root", Net: "tcp", Addr: "localhost:3306", DBName: "test"},
		"root@tcp(127.0.0.1:3306)/test?parseTime=true": {User: "root", Net: "tcp", Addr: "127.0.0.1:3306", DBName: "test", ParseTime: true},
	} {
		got, err := Parse(dsn)
		if err != nil || got.Kind != "mysql" {
			t.Errorf("Parse(%q) = %q, %v; want mysql", dsn, got.Kind, err)
			continue
		}
		cfg, err := mysql.ParseDSN(got.MySQL)
		if err != nil {
			t.Fatalf("Parse(%q) gave DSN %q: %v", dsn, got.MySQL, err)
		}
		if cfg.User != want.User || cfg.Passwd != want.Passwd || cfg.Net != want.Net || cfg.Addr != want.Addr ||
			cfg.DBName != want.DBName || cfg.ParseTime != want.ParseTime || cfg.Timeout != want.Timeout {
			t.Errorf("Parse(%q) gave DSN %q = %+v, want %+v", dsn, got.MySQL, cfg, want)
		}
	}
	for dsn, want := range map[string]Target{
		"sqlite:/tmp/x.db":     {Kind: "sqlite", Path: "/tmp/x.db"},
		"./payments.db":        {Kind: "sqlite", Path: "./payments.db"},
		"/var/lib/app/keys.db": {Kind: "sqlite", Path: "/var/lib/app/keys.db"},
	} {
		got, err := Parse(dsn)
		if err != nil || got.Kind != want.Kind || got.Path != want.Path {
			t.Errorf("Parse(%q) = %q %q, %v; want %q %q", dsn, got.Kind, got.Path, err, want.Kind, want.Path)
		}
	}
	for _, dsn := range []string{"postgres://u@h/db", "postgresql://u@h:5433/db?sslmode=disable"} {
		if got, err := Parse(dsn); err != nil || got.Kind != "postgres" {
			t.Errorf("Parse(%q) = %q, %v; want postgres", dsn, got.Kind, err)
		}
	}
	for dsn, viaSQL := range map[string]bool{"postgres://u@h/db": false, "postgres+sql://u:p@h:5433/db?sslmode=disable": true, "postgresql+sql://u@h/db": true} {
		got, err := Parse(dsn)
		if err != nil || got.Kind != "postgres" || got.DatabaseSQL != viaSQL || got.Postgres.ConnConfig.Host != "h" {
			t.Errorf("Parse(%q) = %q DatabaseSQL %v, %v; want postgres, %v", dsn, got.Kind, got.DatabaseSQL, err, viaSQL)
		}
	}
	if got, err := Parse("redis://h:6380/2"); err != nil || got.Kind != "redis" || got.Redis.Addr != "h:6380" || got.Redis.DB != 2 {
		t.Errorf("Parse(redis) = %+v, %v", got, err)
	}
}

// TestErrorRedacts: the message of a refused value never holds its
// password, whichever part of the message echoes it (the value, or the
// parser's error that quotes it).
func TestErrorRedacts(t *testing.T) {
	t.Parallel()
	const secret = "Planted-S3cret"
	for _, dsn := range []string{
		"postgres://u:" + secret + "@h:notaport/db",
		"postgres://u:" + secret + "@h/db?sslmode=bogus",
		"mysql://root:" + secret + "@[::1/test",
		"mysql://root:" + secret + "@h:3306/",
		"root:" + secret + "@tcp(127.0.0.1:3306/test",
		"root:" + secret + "@127.0.0.1:3306/test",
		"redis://u:" + secret + "@[::1/0",
		"redis://u:" + secret + "@h:6379/notadb",
		"ftp://u:" + secret + "@h/db",
		"u:" + secret + "@h:6379",
	} {
		_, err := Parse(dsn)
		if err == nil {
			t.Errorf("Parse(%q) accepted", dsn)
			continue
		}
		if strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "xxxxx") {
			t.Errorf("Parse(%q): the message does not redact the password:\n%s", dsn, err)
		}
	}
}
