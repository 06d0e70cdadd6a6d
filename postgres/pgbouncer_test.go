package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/pgdbtest"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// bouncerOptions configure a private PgBouncer: see pgdbtest.BouncerOptions.
type bouncerOptions = pgdbtest.BouncerOptions

// startPgBouncer starts a private PgBouncer in transaction pooling mode in
// front of the test server: see pgdbtest.StartPgBouncer, which the lib/pq
// tests (internal/pqtest) share.
func startPgBouncer(t testing.TB, o bouncerOptions) string {
	t.Helper()
	return pgdbtest.StartPgBouncer(t, o)
}

// bouncerPool returns a pool on dsn (a PgBouncer's) built as the README
// builds one: pgxpool's defaults, so QueryExecModeCacheStatement.
func bouncerPool(t testing.TB, dsn string, maxConns int) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if maxConns > 0 {
		cfg.MaxConns = int32(maxConns)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestPgBouncerReplicas is the reproduction: two replicas (two
// pools built as the README builds one, each with its own Guard) behind one
// PgBouncer in transaction mode whose server connections last 1s, 20
// callers per replica on each of 10 keys, the keys one after the other.
// Every call must succeed, each key's effect run once, and every caller of
// a key get the same bytes.
func TestPgBouncerReplicas(t *testing.T) {
	dsn := startPgBouncer(t, bouncerOptions{PoolSize: 4, Lifetime: 1})
	ctx := testkit.Context(t, 60*time.Second)
	pools := []*pgxpool.Pool{bouncerPool(t, dsn, 0), bouncerPool(t, dsn, 0)}
	// The table is made, and effects counted, on the server itself.
	f := newFixture(t, newPool(t, 2), postgres.Config{})
	guards := make([]*idempotency.Guard[pgx.Tx], len(pools))
	for i, pool := range pools {
		s, err := postgres.New(pool, &postgres.Config{Table: f.table})
		if err != nil {
			t.Fatal(err)
		}
		if guards[i], err = idempotency.New(s, nil); err != nil {
			t.Fatal(err)
		}
	}
	const keys, callers = 10, 20
	var failed []string
	start := time.Now()
	for k := range keys {
		key := idempotency.Key{ID: testkit.Name("bouncer-")}
		bodies := make([][]byte, 2*callers)
		errs := make([]error, 2*callers)
		testkit.Together(2*callers, func(i int) {
			resp, err := guards[i%2].Do(ctx, key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
				// fn's own statements name a mode that is safe behind the
				// pooler (see docs/deployments.md): the pool's default is
				// the store's business only.
				if _, err := tx.Exec(ctx, "INSERT INTO "+f.effects+" (tag) VALUES ($1)", pgx.QueryExecModeExec, key.ID); err != nil {
					return idempotency.Response{}, err
				}
				var token string
				if err := tx.QueryRow(ctx, "SELECT md5(random()::text)", pgx.QueryExecModeExec).Scan(&token); err != nil {
					return idempotency.Response{}, err
				}
				// Long enough for the 10 keys to outlast a server
				// connection's lifetime.
				time.Sleep(150 * time.Millisecond)
				return idempotency.Response{Status: 201, Body: []byte(token)}, nil
			})
			bodies[i], errs[i] = resp.Body, err
		})
		var first []byte
		for i, err := range errs {
			switch {
			case err != nil:
				failed = append(failed, fmt.Sprintf("key %d caller %d: %v", k, i, err))
			case first == nil:
				first = bodies[i]
			}
		}
		for i, err := range errs {
			if err == nil && (!bytes.Equal(bodies[i], first) || len(bodies[i]) != 32) {
				t.Errorf("key %d caller %d: body %q, another caller got %q", k, i, bodies[i], first)
			}
		}
		testkit.MustCount(t, ctx, f.count, key.ID, 1)
	}
	t.Logf("%d calls in %v, %d failed", 2*callers*keys, time.Since(start).Round(time.Millisecond), len(failed))
	for _, pool := range pools {
		checkBackends(t, ctx, pool, "pooled")
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d calls failed; the first:\n%s", len(failed), 2*callers*keys, strings.Join(failed[:min(len(failed), 5)], "\n"))
	}
}

// TestPgBouncerNoLeak runs every path of the store (a new key, a replay, fn
// failing, a caller waiting for a key another replica holds and then
// replaying it or, its holder failing, running fn itself, a take-over
// of an expired key, LookupAlways, SERIALIZABLE's pending row, Purge)
// through a PgBouncer of two server connections, then checks, as a new
// client of each of those server connections, that the store left nothing
// behind: the timeouts it bounds are the server's defaults, no advisory
// lock is held and no statement is prepared.
func TestPgBouncerNoLeak(t *testing.T) {
	dsn := startPgBouncer(t, bouncerOptions{PoolSize: 2, Lifetime: 60})
	ctx := testkit.Context(t, 60*time.Second)
	f := newFixture(t, newPool(t, 2), postgres.Config{})
	pools := []*pgxpool.Pool{bouncerPool(t, dsn, 2), bouncerPool(t, dsn, 2)}
	now := time.Now()
	clock := func() time.Time { return now }
	var guards []*idempotency.Guard[pgx.Tx]
	var stores []*postgres.Store
	for i, cfg := range []postgres.Config{
		{Table: f.table, Clock: clock},
		{Table: f.table, Clock: clock},
		{Table: f.table, Clock: clock, Lookup: backend.LookupAlways},
		{Table: f.table, Clock: clock, TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}},
	} {
		s, err := postgres.New(pools[i%2], &cfg)
		if err != nil {
			t.Fatal(err)
		}
		g, err := idempotency.New(s, &idempotency.Config{TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		stores, guards = append(stores, s), append(guards, g)
	}
	var (
		mu   sync.Mutex
		pids = map[int32]bool{}
	)
	call := func(g *idempotency.Guard[pgx.Tx], id string, hold time.Duration, fail error) (idempotency.Response, error) {
		return g.Do(ctx, idempotency.Key{ID: id}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			if _, err := tx.Exec(ctx, "INSERT INTO "+f.effects+" (tag) VALUES ($1)", pgx.QueryExecModeExec, id); err != nil {
				return idempotency.Response{}, err
			}
			var pid int32
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeExec).Scan(&pid); err != nil {
				return idempotency.Response{}, err
			}
			mu.Lock()
			pids[pid] = true
			mu.Unlock()
			time.Sleep(hold)
			return idempotency.Response{Status: 201, Body: []byte(id)}, fail
		})
	}
	errFail := errors.New("fn fails")
	for i, g := range guards {
		id := fmt.Sprintf("leak-%d-%s", i, testkit.Name(""))
		if _, err := call(g, id, 0, errFail); !errors.Is(err, errFail) {
			t.Fatalf("store %d, fn fails: %v", i, err)
		}
		if r, err := call(g, id, 0, nil); err != nil || r.Replayed {
			t.Fatalf("store %d, new key: %+v, %v", i, r, err)
		}
		if r, err := call(g, id, 0, nil); err != nil || !r.Replayed {
			t.Fatalf("store %d, replay: %+v, %v", i, r, err)
		}
	}
	// A caller of replica 1 waits (under its own lock_timeout) while
	// replica 0 holds the key.
	held := testkit.Name("held-")
	results := make([]error, 2)
	replayed := make([]bool, 2)
	testkit.Together(2, func(i int) {
		if i == 1 {
			time.Sleep(100 * time.Millisecond)
		}
		r, err := call(guards[i], held, 400*time.Millisecond, nil)
		results[i], replayed[i] = err, r.Replayed
	})
	if results[0] != nil || results[1] != nil || replayed[0] || !replayed[1] {
		t.Fatalf("holder and waiter: %v, %v; replayed %v", results[0], results[1], replayed)
	}
	testkit.MustCount(t, ctx, f.count, held, 1)
	// The same, but the holder fails: the waiter then runs fn and commits
	// the transaction its wait began.
	held = testkit.Name("held-")
	testkit.Together(2, func(i int) {
		fail := errFail
		if i == 1 {
			time.Sleep(100 * time.Millisecond)
			fail = nil
		}
		r, err := call(guards[i], held, 400*time.Millisecond, fail)
		results[i], replayed[i] = err, r.Replayed
	})
	if !errors.Is(results[0], errFail) || results[1] != nil || replayed[1] {
		t.Fatalf("failing holder and waiter: %v, %v; replayed %v", results[0], results[1], replayed)
	}
	testkit.MustCount(t, ctx, f.count, held, 1)
	// Expired: each store takes a key over, then purges.
	now = now.Add(2 * time.Hour)
	for i, g := range guards {
		id := fmt.Sprintf("leak-%d-over-%s", i, testkit.Name(""))
		if _, err := call(g, id, 0, nil); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(2 * time.Hour)
	for i, g := range guards {
		id := fmt.Sprintf("leak-%d-expired-%s", i, testkit.Name(""))
		if _, err := call(g, id, 0, nil); err != nil {
			t.Fatal(err)
		}
		now = now.Add(2 * time.Hour)
		if r, err := call(g, id, 0, nil); err != nil || r.Replayed {
			t.Fatalf("store %d, expired key taken over: %+v, %v", i, r, err)
		}
	}
	now = now.Add(time.Hour)
	for i, s := range stores {
		if _, err := s.Purge(ctx, 1000); err != nil {
			t.Fatalf("store %d, Purge: %v", i, err)
		}
	}
	for _, p := range pools {
		p.Close()
	}

	// The server's defaults, as a fresh session on the server sees them.
	settings := []string{"lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout", "transaction_isolation"}
	defaults := showSettings(t, ctx, testenv.PostgresDSN(t), settings)
	// Two clients of the bouncer, each in a transaction at once, get one
	// server connection each: the two the store used.
	var seen []int32
	for range 2 {
		c, err := pgx.Connect(ctx, dsn+"&default_query_exec_mode=simple_protocol")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.WithoutCancel(ctx))
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		var (
			pid      int32
			locks    int
			prepared []string
			saved    *string
		)
		err = c.QueryRow(ctx, `SELECT pg_backend_pid(),
			(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
			ARRAY(SELECT name FROM pg_prepared_statements),
			current_setting('idempotency.saved_lock_timeout', true)`).Scan(&pid, &locks, &prepared, &saved)
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, pid)
		if locks != 0 || len(prepared) != 0 {
			t.Errorf("server connection %d: %d advisory locks held, prepared statements %q; want none", pid, locks, prepared)
		}
		// A placeholder variable set locally stays defined, empty, for the
		// rest of the session: it has no effect and holds no value.
		if saved != nil && *saved != "" {
			t.Errorf("server connection %d: idempotency.saved_lock_timeout = %q after the store's transactions", pid, *saved)
		}
		for _, name := range settings {
			var v string
			if err := c.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
				t.Fatal(err)
			}
			if v != defaults[name] {
				t.Errorf("server connection %d: %s = %q, the server's default is %q", pid, name, v, defaults[name])
			}
		}
	}
	for _, pid := range seen {
		delete(pids, pid)
	}
	if len(pids) != 0 || len(seen) != 2 || seen[0] == seen[1] {
		t.Fatalf("checked server connections %v; fn ran on others too: %v", seen, pids)
	}
}

// showSettings returns the values of names in a new session of dsn.
func showSettings(t testing.TB, ctx context.Context, dsn string, names []string) map[string]string {
	t.Helper()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	m := map[string]string{}
	for _, name := range names {
		var v string
		if err := c.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		m[name] = v
	}
	return m
}

// TestPgBouncerConformance runs the shared suite through a PgBouncer in
// transaction mode whose server connections last 1s, with fn's statements
// (the fixtures') in the exec mode docs/deployments.md names for them, and
// in the store's row mode (SERIALIZABLE) too.
func TestPgBouncerConformance(t *testing.T) {
	dsn := startPgBouncer(t, bouncerOptions{PoolSize: 10, Lifetime: 1})
	t.Run("ReadCommitted", func(t *testing.T) {
		conformance.Run(t, harness(postgres.Config{}, viaBouncer(t, dsn, pgx.QueryExecModeExec)))
	})
	t.Run("SerializableCacheDescribe", func(t *testing.T) {
		conformance.Run(t, harness(postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}},
			viaBouncer(t, dsn, pgx.QueryExecModeCacheDescribe)))
	})
}

// viaBouncer points a pool's configuration at the PgBouncer of dsn, with
// mode as its default exec mode.
func viaBouncer(t testing.TB, dsn string, mode pgx.QueryExecMode) func(*pgxpool.Config) {
	b, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return func(c *pgxpool.Config) {
		c.ConnConfig.Host, c.ConnConfig.Port, c.ConnConfig.Fallbacks = b.ConnConfig.Host, b.ConnConfig.Port, nil
		c.ConnConfig.DefaultQueryExecMode = mode
	}
}

// TestPgBouncerFaults runs the fault suite (warm and cold) with its proxy
// between the client and a PgBouncer in transaction mode whose server
// connections last 1s: the faults hit what the store's client sees, and
// PgBouncer must pass each on to the server (a client that is gone ends
// its server connection's transaction, which frees the key). A partition
// hides the client's end from PgBouncer as it would from the server: the
// server connections run with idle_in_transaction_session_timeout (set by
// PgBouncer's connect_query, since PgBouncer refuses it as a startup
// parameter), which ends the stalled transaction. fn's statements run in
// the exec mode docs/deployments.md names for them.
func TestPgBouncerFaults(t *testing.T) {
	dsn := startPgBouncer(t, bouncerOptions{PoolSize: 10, Lifetime: 1,
		ConnectQuery: fmt.Sprintf("SET idle_in_transaction_session_timeout = %d", faultIdleTimeout.Milliseconds())})
	dsn += "&default_query_exec_mode=exec"
	upstream := faultUpstream(t, dsn)
	conformance.RunFaultsWarmAndCold(t, conformance.FaultHarness[pgx.Tx]{
		Upstream: upstream,
		NewFixture: func(t testing.TB, addr, ns string) conformance.Fixture[pgx.Tx] {
			return faultFixture(t, dsn, addr, ns, 0, addr == upstream)
		},
		CallTimeout:    time.Second,
		Bound:          3 * time.Second,
		PartitionBound: faultIdleTimeout + 1500*time.Millisecond,
	})
}

// TestPgBouncerStatementCacheHint: fn's statements in pgx's default exec
// mode behind a transaction pooler fail, and the error names the setting
// to change. With one server connection, a second client's first use of a
// statement the first client's cache prepared there is refused (42P05).
func TestPgBouncerStatementCacheHint(t *testing.T) {
	dsn := startPgBouncer(t, bouncerOptions{PoolSize: 1, Lifetime: 60})
	ctx := testkit.Context(t, 30*time.Second)
	f := newFixture(t, newPool(t, 2), postgres.Config{})
	var errs []error
	for i := range 2 {
		s, err := postgres.New(bouncerPool(t, dsn, 1), &postgres.Config{Table: f.table})
		if err != nil {
			t.Fatal(err)
		}
		g, err := idempotency.New(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("hint-%d-%s", i, testkit.Name(""))
		_, err = g.Do(ctx, idempotency.Key{ID: id}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			_, err := tx.Exec(ctx, "INSERT INTO "+f.effects+" (tag) VALUES ($1)", "hint")
			return idempotency.Response{Status: 201}, err
		})
		errs = append(errs, err)
	}
	var pgErr *pgconn.PgError
	switch {
	case errs[0] != nil:
		t.Fatalf("first client: %v", errs[0])
	case !errors.Is(errs[1], postgres.ErrStatementCacheBehindPooler) || !errors.As(errs[1], &pgErr) || pgErr.Code != "42P05":
		t.Fatalf("second client: %v; want ErrStatementCacheBehindPooler and SQLSTATE 42P05", errs[1])
	case !strings.Contains(errs[1].Error(), "default_query_exec_mode=exec"):
		t.Fatalf("second client: %v; want the setting named", errs[1])
	}
	testkit.MustCount(t, ctx, f.count, "hint", 1)
}

// checkBackends fails t unless every idle connection of pool that the store
// used is judged want.
func checkBackends(t testing.TB, ctx context.Context, pool *pgxpool.Pool, want string) {
	t.Helper()
	conns := pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	judged := 0
	for _, c := range conns {
		switch got := postgres.Backend(c.Conn()); got {
		case want:
			judged++
		case "":
		default:
			t.Errorf("a connection of the pool was judged %q; want %q", got, want)
		}
	}
	if judged == 0 {
		t.Errorf("no connection of the pool judged %q (of %d idle)", want, len(conns))
	}
}

// TestBackendJudgedDirect: on a connection to the server itself, the store
// finds its own process id and sends its statements in the pool's mode
// from then on (see TestRoundTrips for their count).
func TestBackendJudgedDirect(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newFixture(t, newPool(t, 1), postgres.Config{})
	g := f.guard(t, nil)
	for range 2 {
		if _, err := g.Do(ctx, idempotency.Key{ID: testkit.Name("direct-")}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, f.effect(ctx, tx, "direct")
		}); err != nil {
			t.Fatal(err)
		}
	}
	checkBackends(t, ctx, f.pool, "direct")
	testkit.MustCount(t, ctx, f.count, "direct", 2)
}
