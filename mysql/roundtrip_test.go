package mysql

import (
	"context"
	"database/sql"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// trips are the round trips of one Do, not counting fn's own statement.
type trips struct{ newKey, replay, waiter int64 }

// TestRoundTrips counts the round trips of one Do, with interpolateParams,
// on every path: a new key, a replay, and a waiter (a caller that finds the
// key held by another process, waits for it in the database and gets its
// record). The Guard first reserves without waiting and, for a held key,
// again with its wait bound.
func TestRoundTrips(t *testing.T) {
	for _, c := range []struct {
		path        path
		sessionWait string
		want        trips
	}{
		// New key: lookup, START TRANSACTION with the INSERT, the UPDATE
		// with COMMIT. Replay: the lookup. Waiter: lookup, START
		// TRANSACTION with the INSERT (refused at once), ROLLBACK, probe
		// (refused: the key is held), read; then lookup, START TRANSACTION
		// with the INSERT (waits: duplicate key), locking read, ROLLBACK.
		{paths[0], "", trips{3, 1, 9}},
		// New key: START TRANSACTION with the INSERT, the UPDATE with
		// COMMIT. Replay: START TRANSACTION with the INSERT (duplicate
		// key), locking read, ROLLBACK. Waiter: START TRANSACTION with the
		// INSERT (refused at once), ROLLBACK, probe, read; then the
		// replay's three.
		{paths[1], "", trips{2, 3, 7}},
		// MySQL's path. New key: lookup (with the session's wait), probe,
		// SET wait, START TRANSACTION, INSERT, SET wait back, UPDATE,
		// COMMIT. Waiter: lookup, probe (refused), read; then lookup, SET
		// wait, START TRANSACTION, INSERT (waits: duplicate key), locking
		// read, ROLLBACK, SET wait back.
		{paths[2], "", trips{8, 1, 10}},
		// The session's wait is the Guard's wait bound already: the waiter
		// sets nothing.
		{paths[2], "30", trips{8, 1, 8}},
		// New key: probe, save and SET wait, START TRANSACTION, INSERT,
		// SET wait back, UPDATE, COMMIT. Replay: probe, SET, START
		// TRANSACTION, INSERT (duplicate key), locking read, ROLLBACK, SET
		// back. Waiter: probe (refused), read; then the replay's but the
		// probe.
		{paths[3], "", trips{7, 7, 8}},
		// MariaDB on a pool not opened by Open: START TRANSACTION and
		// COMMIT on their own. New key: lookup, START TRANSACTION, INSERT,
		// UPDATE, COMMIT. Waiter: lookup, START TRANSACTION, INSERT
		// (refused), ROLLBACK, probe, read; lookup, START TRANSACTION,
		// INSERT (waits), locking read, ROLLBACK.
		{paths[4], "", trips{5, 1, 11}},
	} {
		name := c.path.name
		if c.sessionWait != "" {
			name += "SessionWait" + c.sessionWait
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rt := newRoundTripper(t, c.sessionWait, c.path)
			bare, got := rt.measureAll(t)
			t.Logf("round trips: bare effect transaction %d, new key %d + the effect's, replay %d, waiter %d", bare, got.newKey, got.replay, got.waiter)
			if bare != 3 || got != c.want {
				t.Fatalf("round trips: bare %d, %+v; want 3, %+v", bare, got, c.want)
			}
		})
	}
}

// TestRoundTripsFollowTheLoad: by default a MariaDB store looks a key up
// first only while more than a third of its recent first tries were
// replays, so that a
// stream of replays costs 1 round trip each and a stream of new keys 2 (and
// the effect's); a change of stream costs at most a few calls at the other
// price.
func TestRoundTripsFollowTheLoad(t *testing.T) {
	rt := newRoundTripper(t, "", path{name: "Default", dialect: dialectMariaDB})
	ids := map[string]string{}
	id := func(name string) idempotency.Key {
		if ids[name] == "" {
			ids[name] = testkit.Name("idem_test_")
		}
		return idempotency.Key{ID: ids[name]}
	}
	steps := []struct {
		key  string
		want int64 // round trips, the effect's included
	}{
		// No look-up first yet: a new key in 2 (and the effect), a
		// replay in 3 (INSERT refused, locking read, ROLLBACK)...
		{"a", 3}, {"a", 3},
		// ...until replays are more than a third of first tries: looked
		// up first.
		{"a", 1}, {"a", 1},
		// New keys pay the look-up, four in a row from the top...
		{"b", 4}, {"c", 4}, {"d", 4}, {"e", 4},
		// ...and then they dominate.
		{"f", 3}, {"g", 3},
	}
	for i, s := range steps {
		if got := rt.measure(t, rt.do(id(s.key))); got != s.want {
			t.Fatalf("call %d (key %s): %d round trips, want %d", i, s.key, got, s.want)
		}
	}
	if n, err := rt.f.fx.Count(rt.ctx, "x"); err != nil || n != 7 {
		t.Fatalf("effects: %d, %v; want 7 (one per key)", n, err)
	}
}

// TestDialectDetectedOnce: a Store asks the server's version on its first
// reservation only (one round trip), and recognises the test server.
func TestDialectDetectedOnce(t *testing.T) {
	rt := newRoundTripper(t, "", paths[0])
	rt.s.dialect.Store(int32(dialectUnknown))
	first := rt.measure(t, rt.do(idempotency.Key{ID: testkit.Name("idem_test_")}))
	second := rt.measure(t, rt.do(idempotency.Key{ID: testkit.Name("idem_test_")}))
	var version string
	if err := rt.f.db.QueryRowContext(rt.ctx, "SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	want := dialectMySQL
	if strings.Contains(strings.ToLower(version), "mariadb") {
		want = dialectMariaDB
	}
	if got := dialect(rt.s.dialect.Load()); got != want {
		t.Fatalf("server %q: dialect %d, want %d", version, got, want)
	}
	if first != second+1 {
		t.Fatalf("round trips of the first and second new key: %d and %d, want one more for the first", first, second)
	}
}

// roundTripper runs Do on a pool of one connection whose round trips it
// counts.
type roundTripper struct {
	ctx     context.Context
	n       atomic.Int64
	f       *fixture
	s       *Store
	g       *idempotency.Guard[*sql.Tx]
	holders *Store // a store on another pool, to hold keys
}

func newRoundTripper(t *testing.T, sessionWait string, p path) *roundTripper {
	rt := &roundTripper{ctx: testkit.Context(t, 60*time.Second)}
	cfg := testConfig(t, func(cfg *gomysql.Config) {
		cfg.InterpolateParams = true
		if sessionWait != "" {
			cfg.Params = map[string]string{"innodb_lock_wait_timeout": sessionWait}
		}
	})
	inner, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(&connector{inner: countingConnector{Connector: inner, n: &rt.n}, interpolate: true})
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	rt.f = newFixture(t, db, nil)
	rt.s = newStore(t, db, rt.f.table, p)
	if rt.g, err = idempotency.New(rt.s, nil); err != nil {
		t.Fatal(err)
	}
	rt.holders = newStore(t, openDB(t, testConfig(t, nil), 0), rt.f.table, paths[0])
	return rt
}

func (rt *roundTripper) do(key idempotency.Key) func() error {
	return func() error {
		_, err := rt.g.Do(rt.ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte("ok")}, rt.f.fx.Effect(rt.ctx, tx, "x")
		})
		return err
	}
}

func (rt *roundTripper) measure(t *testing.T, op func() error) int64 {
	t.Helper()
	before := rt.n.Load()
	if err := op(); err != nil {
		t.Fatal(err)
	}
	return rt.n.Load() - before
}

// measureAll returns the round trips of the bare effect transaction and of
// a new key, a replay and a waiter.
func (rt *roundTripper) measureAll(t *testing.T) (int64, trips) {
	bare := rt.measure(t, func() error { return rt.f.fx.Bare(rt.ctx, "bare") })
	key := idempotency.Key{ID: testkit.Name("idem_test_")}
	var got trips
	got.newKey = rt.measure(t, rt.do(key)) - 1
	got.replay = rt.measure(t, rt.do(key))

	held := idempotency.Key{ID: testkit.Name("idem_test_")}
	holder := hold(t, rt.ctx, rt.holders, held)
	go func() {
		if err := waitForLockWaits(rt.ctx, rt.holders.db, rt.f.table, 1); err != nil {
			t.Errorf("the waiter never waited: %v", err)
		}
		if err := holder.Complete(rt.ctx, idempotency.Response{Status: 200}); err != nil {
			t.Errorf("holder: %v", err)
		}
	}()
	got.waiter = rt.measure(t, rt.do(held))
	return bare, got
}

// TestRunRoundTrips counts the round trips of a Guard.Run of one Local
// step (one statement) then Finish, on a new key, not counting the step's
// statement. On MariaDB with a pool of Open: START TRANSACTION with the
// INSERT, the UPDATE with COMMIT, as Do's new key; with LookupAlways, the
// look-up of the key's row first. Without folding (another pool), START
// TRANSACTION and COMMIT go on their own.
func TestRunRoundTrips(t *testing.T) {
	for _, c := range []struct {
		path path
		want int64
	}{
		{paths[0], 3},
		{paths[1], 2},
		{paths[4], 5},
	} {
		t.Run(c.path.name, func(t *testing.T) {
			rt := newRoundTripper(t, "", c.path)
			op := &idempotency.Operation[*sql.Tx]{
				Name: "rt",
				Steps: []idempotency.Step[*sql.Tx]{{Name: "effect", Local: func(ctx context.Context, tx *sql.Tx, _ *idempotency.State) error {
					return rt.f.fx.Effect(ctx, tx, "x")
				}}},
				Finish: func(context.Context, *sql.Tx, *idempotency.State) (idempotency.Response, error) {
					return idempotency.Response{Status: 201, Body: []byte("ok")}, nil
				},
			}
			run := func(id string) func() error {
				return func() error {
					_, err := rt.g.Run(rt.ctx, idempotency.Key{ID: testkit.Name(id)}, "fp", nil, op)
					return err
				}
			}
			rt.measure(t, run("warm-")) // prepares nothing, but dials and reads the server's version
			if got := rt.measure(t, run("run-")) - 1; got != c.want {
				t.Fatalf("round trips of a one-step Run, new key: %d + the step's; want %d", got, c.want)
			}
			n, err := rt.f.fx.Count(rt.ctx, "x")
			if err != nil || n != 2 {
				t.Fatalf("effects: %d, %v; want 2 (one per key)", n, err)
			}
		})
	}
}
