package mysql

import (
	"cmp"
	"context"
	"database/sql"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
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
		{"LookupAlways", variant{dsn: interpolate, cfg: Config{Lookup: idempotency.LookupAlways}}},
		{"LookupNever", variant{dsn: interpolate, cfg: Config{Lookup: idempotency.LookupNever}}},
		{"LookupNeverPrepared", variant{cfg: Config{Lookup: idempotency.LookupNever}}},
		{"SessionWait", variant{dsn: interpolate, dialect: dialectMySQL}},
		{"SessionWaitLookupNever", variant{dsn: interpolate, cfg: Config{Lookup: idempotency.LookupNever}, dialect: dialectMySQL}},
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
	conformance.Benchmark(b, harness(variant{dsn: interpolate, cfg: Config{Lookup: idempotency.LookupNever}}))
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
	lookup  idempotency.LookupPolicy
	dialect dialect
	noFold  bool
}

var paths = []path{
	{"Lookup", idempotency.LookupAlways, dialectMariaDB, false},
	{"LookupNever", idempotency.LookupNever, dialectMariaDB, false},
	{"SessionLookup", idempotency.LookupAdaptive, dialectMySQL, false},
	{"SessionLookupNever", idempotency.LookupNever, dialectMySQL, false},
	{"UnfoldedLookup", idempotency.LookupAlways, dialectMariaDB, true},
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
