package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	gomysql "github.com/go-sql-driver/mysql"
)

func TestConfigRefused(t *testing.T) {
	// A pool on a port nothing listens on: any SQL would fail, and New must
	// not send any.
	db, err := openPool("root@tcp(127.0.0.1:1)/test?timeout=100ms")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	bad := []string{"1abc", "a-b", "a b", "a`b", "db.t", "tëst", "a;DROP", strings.Repeat("a", 64)}
	for _, name := range bad {
		if _, err := New(db, &Config{Table: name}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("New(Table %q): got %v, want ErrInvalidConfig", name, err)
		}
		if _, err := Schema(name); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("Schema(%q): got %v, want ErrInvalidConfig", name, err)
		}
	}
	for _, name := range []string{"", "_x", "Keys_2", strings.Repeat("a", 63)} {
		if _, err := New(db, &Config{Table: name}); err != nil {
			t.Errorf("New(Table %q): %v", name, err)
		}
	}
	for _, iso := range []sql.IsolationLevel{sql.LevelReadUncommitted, sql.LevelSnapshot, sql.LevelLinearizable, sql.LevelWriteCommitted} {
		if _, err := New(db, &Config{Isolation: iso}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("New(Isolation %v): got %v, want ErrInvalidConfig", iso, err)
		}
	}
	if _, err := New(db, &Config{Lookup: backend.LookupNever + 1}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New(unknown Lookup): got %v, want ErrInvalidConfig", err)
	}
	if _, err := New(nil, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New(nil): got %v, want ErrInvalidConfig", err)
	}
	if n := db.Stats().OpenConnections; n != 0 {
		t.Errorf("New opened %d connections, want 0", n)
	}
}

func TestParseDSN(t *testing.T) {
	good := []string{
		"root@tcp(127.0.0.1:3306)/test",
		"root@tcp(127.0.0.1:3306)/test?parseTime=true&loc=Local",
		"root@tcp(127.0.0.1:3306)/test?clientFoundRows=true&interpolateParams=true&multiStatements=true",
		"root@tcp(127.0.0.1:3306)/test?autocommit=1&tx_isolation=%27READ-COMMITTED%27",
		"root@tcp(127.0.0.1:3306)/test?innodb_lock_wait_timeout=5",
		"mysql://root@127.0.0.1:3306/test",
		"mysql://u:p%40ss@db.example/shop?parseTime=true&timeout=5s",
	}
	for _, dsn := range good {
		if _, err := ParseDSN(dsn); err != nil {
			t.Errorf("ParseDSN(%q): %v", dsn, err)
		}
	}
	bad := []string{
		"not a dsn",
		"root@tcp(127.0.0.1:3306)/",
		"root@tcp(127.0.0.1:3306)/test?autocommit=0",
		"root@tcp(127.0.0.1:3306)/test?autocommit=OFF",
		"root@tcp(127.0.0.1:3306)/test?tx_isolation=%27READ-UNCOMMITTED%27",
		"root@tcp(127.0.0.1:3306)/test?transaction_isolation=%27read-uncommitted%27",
		"mysql://root@127.0.0.1:3306/",
		"mysql://root@127.0.0.1:3306/a/b",
		"mysql:///test",
		"mysql://root@127.0.0.1:3306/test?parseTime=maybe",
		"mysql://root@127.0.0.1:3306/test?autocommit=0",
		"mysql://root@[::1/test",
	}
	for _, dsn := range bad {
		if _, err := ParseDSN(dsn); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("ParseDSN(%q): got %v, want ErrInvalidConfig", dsn, err)
		}
		if _, err := Open(context.Background(), dsn); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("Open(%q): got %v, want ErrInvalidConfig", dsn, err)
		}
	}
}

func TestSchemaMigrate(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	db := openDB(t, testConfig(t, nil), 0)
	f := newFixture(t, db, nil) // migrated once
	if err := f.store.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	want, err := Schema(f.table)
	if err != nil || f.store.Schema() != want {
		t.Fatalf("Store.Schema and Schema(%q) differ: %v", f.table, err)
	}
	var engine string
	if err := db.QueryRowContext(ctx, `SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`, f.table).Scan(&engine); err != nil {
		t.Fatal(err)
	}
	if engine != "InnoDB" {
		t.Fatalf("engine: got %q, want InnoDB", engine)
	}
	var idx int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'expires_at'`, f.table).Scan(&idx); err != nil {
		t.Fatal(err)
	}
	if idx != 1 {
		t.Fatalf("indexes on expires_at: got %d, want 1", idx)
	}
}

func TestMapError(t *testing.T) {
	other := errors.New("other")
	ctx := context.Background()
	cases := []struct {
		err     error
		waiting bool
		want    error
	}{
		{&gomysql.MySQLError{Number: 1213}, false, backend.ErrConflict},
		{&gomysql.MySQLError{Number: 1213}, true, backend.ErrConflict},
		{&gomysql.MySQLError{Number: 1205}, true, idempotency.ErrInProgress},
		{&gomysql.MySQLError{Number: 1205}, false, backend.ErrConflict},
		{&gomysql.MySQLError{Number: 3572}, true, idempotency.ErrInProgress},
		{&gomysql.MySQLError{Number: 3572}, false, backend.ErrConflict},
		{&gomysql.MySQLError{Number: 1020}, false, backend.ErrConflict},
		{&gomysql.MySQLError{Number: 1146}, true, idempotency.ErrSchema},
		{&gomysql.MySQLError{Number: 1054}, false, idempotency.ErrSchema},
		{&gomysql.MySQLError{Number: 1062}, true, errDuplicate},
		{&gomysql.MySQLError{Number: 1644, SQLState: [5]byte{'4', '5', '0', '0', '0'}, Message: pendingGone}, false, errPendingGone},
		{fmt.Errorf("wrapped: %w", &gomysql.MySQLError{Number: 1213}), false, backend.ErrConflict},
		{other, false, other},
	}
	for _, c := range cases {
		got := mapError(ctx, c.err, c.waiting, "")
		if !errors.Is(got, c.want) || !errors.Is(got, c.err) {
			t.Errorf("mapError(%v, %v) = %v, want it to wrap %v", c.err, c.waiting, got, c.want)
		}
		if again := mapError(ctx, got, !c.waiting, ""); again != got {
			t.Errorf("mapError is not idempotent on %v: %v", got, again)
		}
		prefixed := mapError(ctx, c.err, c.waiting, "mysql: key %q", "k")
		if !errors.Is(prefixed, c.want) || !strings.HasPrefix(prefixed.Error(), `mysql: key "k": `) {
			t.Errorf("mapError(%v, %v, prefix) = %v", c.err, c.waiting, prefixed)
		}
	}
	for _, err := range []error{&gomysql.MySQLError{Number: 1048}, &gomysql.MySQLError{Number: 1644, Message: "a SIGNAL of fn's own"}} {
		if got := mapError(ctx, err, false, ""); got != err {
			t.Errorf("mapError(%v) = %v, want it unmapped", err, got)
		}
	}
	if mapError(ctx, nil, true, "x") != nil {
		t.Errorf("mapError(nil) is not nil")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if got := mapError(cctx, driver.ErrBadConn, false, ""); !errors.Is(got, context.Canceled) || !errors.Is(got, driver.ErrBadConn) {
		t.Errorf("mapError after a cancel = %v, want context.Canceled and the driver's error", got)
	}
	// IsConflict agrees with mapError on what a retry can cure.
	s := &Store{}
	for _, n := range []uint16{1213, 1205, 1020, 3572, 1062, 1146} {
		err := &gomysql.MySQLError{Number: n}
		if got, want := s.IsConflict(fmt.Errorf("fn: %w", err)), errors.Is(mapError(ctx, err, false, ""), backend.ErrConflict); got != want {
			t.Errorf("IsConflict(%d) = %v, mapError says %v", n, got, want)
		}
	}
	if s.IsConflict(other) {
		t.Errorf("IsConflict(other) = true")
	}
}

func TestLockWaitSeconds(t *testing.T) {
	cases := map[time.Duration]int64{
		0: 1, time.Nanosecond: 1, 300 * time.Millisecond: 1, time.Second: 1,
		time.Second + 1: 2, 30 * time.Second: 30, 1<<63 - 1: maxLockWait,
	}
	for d, want := range cases {
		if got := lockWaitSeconds(d); got != want {
			t.Errorf("lockWaitSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

// TestParseDSNURL: the URL form gives the configuration of the driver's
// form, with the default port and escaped credentials.
func TestParseDSNURL(t *testing.T) {
	for dsn, want := range map[string]gomysql.Config{
		"mysql://u:p%40ss@db.example:3307/shop?parseTime=true&timeout=5s": {
			User: "u", Passwd: "p@ss", Net: "tcp", Addr: "db.example:3307", DBName: "shop", ParseTime: true, Timeout: 5 * time.Second,
		},
		"mysql://root@localhost/test": {User: "root", Net: "tcp", Addr: "localhost:3306", DBName: "test"},
		"mysql://root@[::1]/test":     {User: "root", Net: "tcp", Addr: "[::1]:3306", DBName: "test"},
	} {
		cfg, err := ParseDSN(dsn)
		if err != nil {
			t.Errorf("ParseDSN(%q): %v", dsn, err)
			continue
		}
		if cfg.User != want.User || cfg.Passwd != want.Passwd || cfg.Net != want.Net || cfg.Addr != want.Addr ||
			cfg.DBName != want.DBName || cfg.ParseTime != want.ParseTime || cfg.Timeout != want.Timeout {
			t.Errorf("ParseDSN(%q) = %+v, want %+v", dsn, cfg, want)
		}
	}
}

// TestOpen: Open reaches the test server from both DSN forms, and reports
// a server that does not answer as an error that is not ErrInvalidConfig.
func TestOpen(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	cfg := testConfig(t, nil)
	u := url.URL{Scheme: "mysql", User: url.UserPassword(cfg.User, cfg.Passwd), Host: cfg.Addr, Path: "/" + cfg.DBName}
	for _, dsn := range []string{cfg.FormatDSN(), u.String()} {
		db, err := Open(ctx, dsn)
		if err != nil {
			t.Errorf("Open(%q): %v", dsn, err)
			continue
		}
		if _, err := New(db, nil); err != nil {
			t.Errorf("New on a pool of Open(%q): %v", dsn, err)
		}
		_ = db.Close()
	}
	if _, err := Open(ctx, "root@tcp(127.0.0.1:1)/test?timeout=100ms"); err == nil || errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("Open(closed port): got %v, want a connection error", err)
	}
}
