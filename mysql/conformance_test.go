package mysql

import (
	"cmp"
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// variant is one way of running the store in the tests and benchmarks.
type variant struct {
	dsn     func(*gomysql.Config) // changes to the test DSN, if not nil
	cfg     Config                // the store's Config (the fixture sets Table)
	dialect dialect               // forced on the store if not dialectUnknown
	noFold  bool                  // Store.noFold
}

func interpolate(c *gomysql.Config) { c.InterpolateParams = true }

func harness(v variant) conformance.Harness[*sql.Tx] {
	return conformance.Harness[*sql.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*sql.Tx] {
			db := openDB(t, testConfig(t, v.dsn), opts.MaxConns)
			cfg := v.cfg
			cfg.Clock = opts.Clock
			f := newFixture(t, db, &cfg)
			f.store.dialect.Store(int32(v.dialect))
			f.store.noFold = v.noFold
			// Another store on the same table, with a pool of its own:
			// another process of the service.
			reopen := func(context.Context) (idempotency.KeyStore[*sql.Tx], error) {
				c := cfg // the same test clock, if any
				c.Table = f.table
				s, err := New(openDB(t, testConfig(t, v.dsn), cmp.Or(opts.MaxConns, 6)), &c)
				if err != nil {
					return nil, err
				}
				s.dialect.Store(int32(v.dialect))
				s.noFold = v.noFold
				return s, nil
			}
			return conformance.Fixture[*sql.Tx]{Store: f.store, Effect: f.fx.Effect, Count: f.fx.Count, Bare: f.fx.Bare, Fill: f.fill, Reopen: reopen}
		},
	}
}

// TestConformance runs the shared suite with server-side prepared
// statements (the driver's default) and with interpolateParams=true, with
// the lookup as the load says (the default), always and never; with START TRANSACTION and COMMIT sent on their
// own (as on a pool not opened by Open); and, on the test server, the path
// the store takes on MySQL (the lock wait bound set on the session), which
// MariaDB accepts too.
func TestConformance(t *testing.T) {
	for _, c := range []struct {
		name string
		v    variant
	}{
		{"Prepared", variant{}},
		{"Interpolated", variant{dsn: interpolate}},
		{"Unfolded", variant{dsn: interpolate, noFold: true}},
		{"LookupAlways", variant{dsn: interpolate, cfg: Config{Lookup: backend.LookupAlways}}},
		{"LookupNever", variant{dsn: interpolate, cfg: Config{Lookup: backend.LookupNever}}},
		{"LookupNeverPrepared", variant{cfg: Config{Lookup: backend.LookupNever}}},
		{"SessionWait", variant{dsn: interpolate, dialect: dialectMySQL}},
		{"SessionWaitLookupNever", variant{dsn: interpolate, cfg: Config{Lookup: backend.LookupNever}, dialect: dialectMySQL}},
	} {
		t.Run(c.name, func(t *testing.T) { conformance.Run(t, harness(c.v)) })
	}
}

// BenchmarkStore runs the shared benchmarks with the default Config and
// interpolateParams=true (see cmd/idembench).
func BenchmarkStore(b *testing.B) {
	conformance.Benchmark(b, harness(variant{dsn: recommended}))
}

// recommended is the DSN the package documentation recommends:
// interpolateParams, and a session innodb_lock_wait_timeout equal to the
// Guard's default WaitTimeout (30s).
func recommended(c *gomysql.Config) {
	interpolate(c)
	if c.Params == nil {
		c.Params = map[string]string{}
	}
	c.Params["innodb_lock_wait_timeout"] = "30"
}

// BenchmarkDefaultDSN is BenchmarkStore on a DSN with interpolateParams
// only.
func BenchmarkDefaultDSN(b *testing.B) {
	conformance.Benchmark(b, harness(variant{dsn: interpolate}))
}

// BenchmarkSessionWait is BenchmarkStore on the path the store takes on
// MySQL: each reservation sets and restores the session's
// innodb_lock_wait_timeout.
func BenchmarkSessionWait(b *testing.B) {
	conformance.Benchmark(b, harness(variant{dsn: recommended, dialect: dialectMySQL}))
}

// BenchmarkLookupNever is BenchmarkStore with Config.Lookup LookupNever.
func BenchmarkLookupNever(b *testing.B) {
	conformance.Benchmark(b, harness(variant{dsn: interpolate, cfg: Config{Lookup: backend.LookupNever}}))
}

// BenchmarkScale runs the shared scale benchmarks (1M keys); see
// conformance.BenchmarkScale.
func BenchmarkScale(b *testing.B) {
	conformance.BenchmarkScale(b, harness(variant{dsn: interpolate}))
}

// path is one of the store's code paths, which the package's own tests
// cover one by one: Config.Lookup LookupAlways or LookupNever (the default
// takes one or the other by the load: TestRoundTripsFollowTheLoad); the
// lock wait bound per statement (MariaDB) or on the session (MySQL); START
// TRANSACTION and COMMIT folded into the store's statements or not.
type path struct {
	name    string
	lookup  backend.LookupPolicy
	dialect dialect
	noFold  bool
}

var paths = []path{
	{"Lookup", backend.LookupAlways, dialectMariaDB, false},
	{"LookupNever", backend.LookupNever, dialectMariaDB, false},
	{"SessionLookup", backend.LookupAdaptive, dialectMySQL, false},
	{"SessionLookupNever", backend.LookupNever, dialectMySQL, false},
	{"UnfoldedLookup", backend.LookupAlways, dialectMariaDB, true},
}

// newStore returns a store on db for table that takes path p.
func newStore(t testing.TB, db *sql.DB, table string, p path) *Store {
	t.Helper()
	return newStoreIso(t, db, table, p, sql.LevelDefault)
}

// newStoreIso is newStore with Config.Isolation iso.
func newStoreIso(t testing.TB, db *sql.DB, table string, p path, iso sql.IsolationLevel) *Store {
	t.Helper()
	s, err := New(db, &Config{Table: table, Lookup: p.lookup, Isolation: iso})
	if err != nil {
		t.Fatal(err)
	}
	s.dialect.Store(int32(p.dialect))
	s.noFold = p.noFold
	return s
}

// faultIdleTimeout is how long the fault fixtures' sessions may sit idle
// (idle_transaction_timeout on MariaDB, wait_timeout on MySQL) before the
// server ends them: a session whose client vanished behind a partition (the
// server never sees the connection close) holds its key until then. Without
// it the key stays held for wait_timeout, 8 hours by default, or until TCP
// keepalives notice.
const faultIdleTimeout = 2 * time.Second

// TestFaults runs the fault-injection suite (a cut connection, a lost
// reply, a partition and a slow step at every round trip of a call) on a
// warm and on a cold pool: see conformance.RunFaultsWarmAndCold.
func TestFaults(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	upstream := cfg.Addr
	idle := faultIdleParam(t, cfg)
	conformance.RunFaultsWarmAndCold(t, conformance.FaultHarness[*sql.Tx]{
		Upstream: upstream,
		NewFixture: func(t testing.TB, addr, ns string) conformance.Fixture[*sql.Tx] {
			return faultFixture(t, cfg, addr, ns, idle, addr == upstream)
		},
		CallTimeout:    time.Second,
		Bound:          3 * time.Second,
		PartitionBound: faultIdleTimeout + 1500*time.Millisecond,
	})
}

// faultIdleParam returns the session variable that ends a session idle in a
// transaction: MariaDB's idle_transaction_timeout, else (MySQL) the
// wait_timeout of every idle session.
func faultIdleParam(t *testing.T, cfg *gomysql.Config) string {
	t.Helper()
	db, err := Open(testkit.Context(t, 30*time.Second), cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var version string
	if err := db.QueryRow("SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(version, "MariaDB") {
		return "idle_transaction_timeout"
	}
	return "wait_timeout"
}

// faultFixture is a store on table faults_<ns> and an effects table
// faults_<ns>_fx, on a pool that dials addr. The fixture on the server
// itself (owner) creates and drops both tables.
func faultFixture(t testing.TB, base *gomysql.Config, addr, ns, idle string, owner bool) conformance.Fixture[*sql.Tx] {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := base.Clone()
	cfg.Addr, cfg.Net = addr, "tcp"
	cfg.Timeout = 2 * time.Second
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params[idle] = strconv.Itoa(int(faultIdleTimeout.Seconds()))
	db, err := Open(ctx, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	db.SetMaxIdleConns(4)
	db.SetConnMaxIdleTime(faultIdleTimeout / 2) // wait_timeout: never reuse a session the server may have ended
	table := "faults_" + ns
	effects := "`" + table + "_fx`"
	store, err := New(db, &Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if owner {
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+effects+" (n BIGINT AUTO_INCREMENT PRIMARY KEY, tag VARCHAR(64) NOT NULL) ENGINE=InnoDB"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if owner {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+effects+", `"+table+"`")
		}
		_ = db.Close()
	})
	fx := testkit.Effects{DB: db, Table: effects}
	return conformance.Fixture[*sql.Tx]{Store: store, Effect: fx.Effect, Count: fx.Count}
}
