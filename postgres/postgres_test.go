package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/postgres"
)

// testTimeout bounds every test of this file.
const testTimeout = 30 * time.Second

// isolation sets the session's default isolation level on every connection
// of a pool, as a pool configured by its user could.
func isolation(level string) func(*pgxpool.Config) {
	return func(c *pgxpool.Config) {
		c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "SET default_transaction_isolation = '"+level+"'")
			return err
		}
	}
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// newPool returns a pool of at most maxConns connections (8 when 0) to the
// test database, closed at cleanup; before that, cleanup fails the test if
// a connection is still acquired.
func newPool(t testing.TB, maxConns int, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	if maxConns <= 0 {
		maxConns = 8
	}
	cfg.MaxConns = int32(maxConns)
	for _, f := range configure {
		f(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for pool.Stat().AcquiredConns() != 0 {
			if time.Now().After(deadline) {
				t.Errorf("%d pool connections still acquired at the end of the test (leaked?)", pool.Stat().AcquiredConns())
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	return pool
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// dropAtCleanup drops the given tables (or schemas, with kind "SCHEMA")
// when the test ends.
func dropAtCleanup(t testing.TB, pool *pgxpool.Pool, kind string, names ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, n := range names {
			if _, err := pool.Exec(ctx, "DROP "+kind+" IF EXISTS "+n+" CASCADE"); err != nil {
				t.Errorf("drop %s %s: %v", kind, n, err)
			}
		}
	})
}

// fixture is a migrated store on a fresh table plus an effects table.
type fixture struct {
	pool    *pgxpool.Pool
	store   *postgres.Store
	table   string
	effects string
}

func newFixture(t testing.TB, pool *pgxpool.Pool, cfg postgres.Config) *fixture {
	t.Helper()
	ctx := testContext(t)
	if cfg.Table == "" {
		cfg.Table = randomName("idem_")
	}
	f := &fixture{pool: pool, table: cfg.Table, effects: cfg.Table + "_effects"}
	if len(f.effects) > 63 {
		f.effects = randomName("idem_effects_")
	}
	dropAtCleanup(t, pool, "TABLE", f.table, f.effects)
	store, err := postgres.New(pool, &cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+f.effects+" (tag TEXT)"); err != nil {
		t.Fatalf("create effects table: %v", err)
	}
	f.store = store
	return f
}

func (f *fixture) effect(ctx context.Context, tx pgx.Tx, tag string) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+f.effects+" (tag) VALUES ($1)", tag)
	return err
}

func (f *fixture) count(ctx context.Context, tag string) (int, error) {
	var n int
	err := f.pool.QueryRow(ctx, "SELECT count(*) FROM "+f.effects+" WHERE tag = $1", tag).Scan(&n)
	return n, err
}

func (f *fixture) mustCount(t testing.TB, ctx context.Context, tag string, want int) {
	t.Helper()
	got, err := f.count(ctx, tag)
	if err != nil {
		t.Fatalf("count %q: %v", tag, err)
	}
	if got != want {
		t.Fatalf("effects %q: got %d, want %d", tag, got, want)
	}
}

func (f *fixture) guard(t testing.TB, cfg *idempotency.Config) *idempotency.Guard[pgx.Tx] {
	t.Helper()
	g, err := idempotency.New(f.store, cfg)
	if err != nil {
		t.Fatalf("idempotency.New: %v", err)
	}
	return g
}

func harness(cfg postgres.Config, configure ...func(*pgxpool.Config)) conformance.Harness[pgx.Tx] {
	return conformance.Harness[pgx.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[pgx.Tx] {
			f := newFixture(t, newPool(t, opts.MaxConns, configure...), cfg)
			return conformance.Fixture[pgx.Tx]{Store: f.store, Effect: f.effect, Count: f.count, Bare: f.bare, Fill: f.fill}
		},
	}
}

// bare is the baseline of the benchmarks: the same one-row insert as
// effect, in a plain transaction of the same pool.
func (f *fixture) bare(ctx context.Context, tag string) error {
	return pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error { return f.effect(ctx, tx, tag) })
}

// fill writes n completed keys in scope "fill" (no benchmark uses it),
// expiring at expiresAt, in one INSERT ... SELECT over generate_series, then
// ANALYZEs the table, as autovacuum would after such a bulk load (the test
// server runs with autovacuum off).
func (f *fixture) fill(ctx context.Context, n int, expiresAt time.Time) error {
	table := pgx.Identifier(strings.Split(f.table, ".")).Sanitize()
	_, err := f.pool.Exec(ctx, `INSERT INTO `+table+` (scope, id, fingerprint, state, status, header, body, created_at, expires_at)
		SELECT 'fill', 'fill-' || g, 'fp', 'completed', 201, '{"Content-Type":["application/json"]}', '{"filled":true}',
			$1::timestamptz - interval '24 hours', $1::timestamptz
		FROM generate_series(1, $2::int) g`, expiresAt, n)
	if err != nil {
		return fmt.Errorf("fill %d keys: %w", n, err)
	}
	if _, err := f.pool.Exec(ctx, `ANALYZE `+table); err != nil {
		return fmt.Errorf("analyze after fill: %w", err)
	}
	return nil
}

// BenchmarkStore compares Do with the bare effect transaction; see
// conformance.Benchmark and cmd/idembench.
func BenchmarkStore(b *testing.B) { conformance.Benchmark(b, harness(postgres.Config{})) }

// BenchmarkScale measures Do and Purge with a million keys in the table; see
// conformance.BenchmarkScale. It takes minutes:
//
//	go test -run '^$' -bench BenchmarkScale -benchtime 500x ./postgres
func BenchmarkScale(b *testing.B) { conformance.BenchmarkScale(b, harness(postgres.Config{})) }

// BenchmarkSkipLookup is BenchmarkStore with Config.SkipLookup (its own
// name, so that idembench's default pattern does not mix the two):
//
//	go test -run '^$' -bench BenchmarkSkipLookup -benchmem ./postgres | go run ./cmd/idembench -parse
func BenchmarkSkipLookup(b *testing.B) {
	conformance.Benchmark(b, harness(postgres.Config{SkipLookup: true}))
}

// TestConformance runs the shared suite under each isolation level a pool
// can default to, and with the level given by Config.TxOptions.
func TestConformance(t *testing.T) {
	t.Run("ReadCommitted", func(t *testing.T) {
		conformance.Run(t, harness(postgres.Config{}))
	})
	t.Run("RepeatableRead", func(t *testing.T) {
		conformance.Run(t, harness(postgres.Config{}, isolation("repeatable read")))
	})
	t.Run("Serializable", func(t *testing.T) {
		conformance.Run(t, harness(postgres.Config{}, isolation("serializable")))
	})
	t.Run("TxOptionsSerializable", func(t *testing.T) {
		conformance.Run(t, harness(postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}))
	})
	t.Run("SkipLookup", func(t *testing.T) {
		conformance.Run(t, harness(postgres.Config{SkipLookup: true}))
	})
	// The simple protocol, as used behind PgBouncer: batches become one
	// multi-statement query.
	t.Run("SimpleProtocol", func(t *testing.T) {
		conformance.Run(t, harness(postgres.Config{}, func(c *pgxpool.Config) {
			c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		}))
	})
}

// TestIsolationLevels checks that each way of setting the isolation level
// reaches fn's transaction, then runs the two cases backends.md measured
// failing (40001 for waiters) directly: 20 callers of one key, and 20
// callers whose winner fails while the others wait.
func TestIsolationLevels(t *testing.T) {
	cases := []struct {
		name      string
		want      string
		cfg       postgres.Config
		configure []func(*pgxpool.Config)
	}{
		{"ServerDefault", "read committed", postgres.Config{}, nil},
		{"PoolRepeatableRead", "repeatable read", postgres.Config{}, []func(*pgxpool.Config){isolation("repeatable read")}},
		{"PoolSerializable", "serializable", postgres.Config{}, []func(*pgxpool.Config){isolation("serializable")}},
		{"TxOptionsRepeatableRead", "repeatable read", postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.RepeatableRead}}, nil},
		{"TxOptionsReadCommittedOverPoolSerializable", "read committed",
			postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.ReadCommitted}}, []func(*pgxpool.Config){isolation("serializable")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			f := newFixture(t, newPool(t, 4, c.configure...), c.cfg)
			g := f.guard(t, nil)

			var level string
			_, err := g.Do(ctx, idempotency.Key{ID: randomName("iso-")}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 200}, tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation')").Scan(&level)
			})
			if err != nil || level != c.want {
				t.Fatalf("fn's isolation level: got %q, %v; want %q", level, err, c.want)
			}

			for _, winnerFails := range []bool{false, true} {
				key := idempotency.Key{ID: randomName("k-")}
				tag := fmt.Sprintf("winner-fails-%v", winnerFails)
				errFail := errors.New("the winner fails")
				var calls atomic.Int64
				results := make([]error, 20)
				replayed := make([]bool, 20)
				gate := make(chan struct{})
				var wg sync.WaitGroup
				for i := range results {
					wg.Go(func() {
						<-gate
						var resp idempotency.Response
						resp, results[i] = g.Do(ctx, key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
							n := calls.Add(1)
							if err := f.effect(ctx, tx, tag); err != nil {
								return idempotency.Response{}, err
							}
							if winnerFails && n == 1 {
								time.Sleep(200 * time.Millisecond)
								return idempotency.Response{}, errFail
							}
							return idempotency.Response{Status: 201, Body: []byte(tag)}, nil
						})
						replayed[i] = resp.Replayed
					})
				}
				close(gate)
				wg.Wait()
				failed, executed := 0, 0
				for i, err := range results {
					switch {
					case winnerFails && errors.Is(err, errFail):
						failed++
					case err != nil:
						t.Fatalf("winnerFails=%v: caller %d: %v; only the failing winner may see an error", winnerFails, i, err)
					case !replayed[i]:
						executed++
					}
				}
				if executed != 1 || (winnerFails && failed != 1) {
					t.Fatalf("winnerFails=%v: %d executed, %d failed; want 1 executed", winnerFails, executed, failed)
				}
				f.mustCount(t, ctx, tag, 1)
			}
		})
	}
}

func TestInvalidTable(t *testing.T) {
	var queries atomic.Int64
	pool := newPool(t, 1, func(c *pgxpool.Config) { c.ConnConfig.Tracer = &tracer{queries: &queries} })
	bad := []string{
		"1abc", "a-b", "a b", `a"b`, "a;drop table x", ".a", "a.", "a.b.c", "ünïcode",
		strings.Repeat("a", 64), "public." + strings.Repeat("a", 64), strings.Repeat("s", 64) + ".a",
	}
	for _, name := range bad {
		if _, err := postgres.New(pool, &postgres.Config{Table: name}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("New with table %q: got %v, want ErrInvalidConfig", name, err)
		}
		if _, err := postgres.Schema(name); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("Schema(%q): got %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := postgres.New(pool, &postgres.Config{TxOptions: pgx.TxOptions{AccessMode: pgx.ReadOnly}}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New with a read-only TxOptions: got %v, want ErrInvalidConfig", err)
	}
	if _, err := postgres.New(nil, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New(nil pool): got %v, want ErrInvalidConfig", err)
	}
	for _, name := range []string{"_a", "A1", "public.keys", strings.Repeat("a", 63), strings.Repeat("s", 63) + "." + strings.Repeat("t", 63)} {
		if _, err := postgres.New(pool, &postgres.Config{Table: name}); err != nil {
			t.Errorf("New with table %q: %v", name, err)
		}
	}
	if n := queries.Load(); n != 0 {
		t.Fatalf("New and Schema sent %d statements, want 0", n)
	}
}

func TestSchemaMigrate(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t, 2)

	// Migrate twice, and the published DDL twice more: all idempotent.
	f := newFixture(t, pool, postgres.Config{})
	if err := f.store.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	ddl, err := postgres.Schema(f.table)
	if err != nil || ddl != f.store.Schema() {
		t.Fatalf("Schema(%q) = %v, want the store's Schema()", f.table, err)
	}
	for range 2 {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatalf("running Schema(): %v", err)
		}
	}
	var cols int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_name = $1`, f.table).Scan(&cols); err != nil || cols != 9 {
		t.Fatalf("columns of %s: got %d, %v; want 9", f.table, cols, err)
	}

	// Concurrent migrations of one table do not trip over each other.
	table := randomName("idem_")
	dropAtCleanup(t, pool, "TABLE", table)
	s, err := postgres.New(pool, &postgres.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = s.Migrate(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent Migrate: %v", err)
	}

	// A schema-qualified table works end to end.
	schema := randomName("idem_s_")
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	dropAtCleanup(t, pool, "SCHEMA", schema)
	qf := newFixture(t, pool, postgres.Config{Table: schema + ".keys"})
	qg := qf.guard(t, nil)
	for i, wantReplayed := range []bool{false, true} {
		r, err := qg.Do(ctx, idempotency.Key{ID: "k"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 200}, qf.effect(ctx, tx, "q")
		})
		if err != nil || r.Replayed != wantReplayed {
			t.Fatalf("schema-qualified table, call %d: got %+v, %v", i, r, err)
		}
	}
	qf.mustCount(t, ctx, "q", 1)

	// Two 63-byte table names sharing a long prefix get distinct indexes.
	prefix := randomName("idem_long_")
	var idx []string
	for _, c := range []string{"a", "b"} {
		name := prefix + strings.Repeat(c, 63-len(prefix))
		lf := newFixture(t, pool, postgres.Config{Table: name})
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%(expires_at)'`, lf.table).Scan(&n); err != nil || n != 1 {
			t.Fatalf("expires_at index of %s: got %d, %v; want 1", name, n, err)
		}
		var def string
		if err := pool.QueryRow(ctx, `SELECT indexname FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%(expires_at)'`, lf.table).Scan(&def); err != nil {
			t.Fatal(err)
		}
		idx = append(idx, def)
	}
	if idx[0] == idx[1] {
		t.Fatalf("two long tables share the index name %q", idx[0])
	}
}

// TestKeysCaseSensitive: abc and ABC are two keys, two rows, two effects.
func TestKeysCaseSensitive(t *testing.T) {
	ctx := testContext(t)
	f := newFixture(t, newPool(t, 2), postgres.Config{})
	g := f.guard(t, nil)
	for _, id := range []string{"abc", "ABC", "abc", "ABC"} {
		_, err := g.Do(ctx, idempotency.Key{Scope: "Scope", ID: id}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 200, Body: []byte(id)}, f.effect(ctx, tx, id)
		})
		if err != nil {
			t.Fatalf("key %q: %v", id, err)
		}
	}
	_, err := g.Do(ctx, idempotency.Key{Scope: "scope", ID: "abc"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 200}, f.effect(ctx, tx, "lower-scope")
	})
	if err != nil {
		t.Fatal(err)
	}
	f.mustCount(t, ctx, "abc", 1)
	f.mustCount(t, ctx, "ABC", 1)
	f.mustCount(t, ctx, "lower-scope", 1)
	var rows int
	if err := f.pool.QueryRow(ctx, "SELECT count(*) FROM "+f.table).Scan(&rows); err != nil || rows != 3 {
		t.Fatalf("key rows: got %d, %v; want 3", rows, err)
	}
}

type callerKey struct{}

// tracer counts statements and round trips, and catches a caller that asks
// the pool for a connection while it holds one (callers are told apart by a
// callerKey value in their context).
type tracer struct {
	queries *atomic.Int64 // statements sent outside batches
	batches atomic.Int64

	mu        sync.Mutex
	owner     map[*pgx.Conn]int
	held      map[int]int
	violation string
}

func (tr *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if tr.queries != nil {
		tr.queries.Add(1)
	}
	return ctx
}
func (tr *tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (tr *tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	tr.batches.Add(1)
	return ctx
}
func (tr *tracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (tr *tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (tr *tracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	id, _ := ctx.Value(callerKey{}).(int)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if id != 0 && tr.held[id] > 0 && tr.violation == "" {
		tr.violation = fmt.Sprintf("caller %d asked the pool for a connection while holding %d", id, tr.held[id])
	}
	return ctx
}

func (tr *tracer) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	if data.Err != nil {
		return
	}
	id, _ := ctx.Value(callerKey{}).(int)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.owner == nil {
		tr.owner, tr.held = map[*pgx.Conn]int{}, map[int]int{}
	}
	tr.owner[data.Conn] = id
	tr.held[id]++
}

func (tr *tracer) TraceRelease(_ *pgxpool.Pool, data pgxpool.TraceReleaseData) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if id, ok := tr.owner[data.Conn]; ok {
		delete(tr.owner, data.Conn)
		tr.held[id]--
	}
}

func (tr *tracer) check(t testing.TB) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.violation != "" {
		t.Fatal(tr.violation)
	}
}

// TestOneConnection runs every path of Do on a pool of ONE connection: a
// call that asked for a second connection while holding the first would
// hang (bounded by the context) and is caught by the tracer.
func TestOneConnection(t *testing.T) {
	tr := &tracer{}
	pool := newPool(t, 1, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr })
	f := newFixture(t, pool, postgres.Config{})
	now := time.Now()
	g := f.guard(t, &idempotency.Config{TTL: time.Hour, Now: func() time.Time { return now }})
	ctx := context.WithValue(testContext(t), callerKey{}, 1)
	call := func(fp string, fail bool) (idempotency.Response, error) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return g.Do(cctx, idempotency.Key{ID: "k"}, fp, func(tx pgx.Tx) (idempotency.Response, error) {
			if err := f.effect(cctx, tx, "one"); err != nil {
				return idempotency.Response{}, err
			}
			if fail {
				return idempotency.Response{}, errors.New("fn fails")
			}
			return idempotency.Response{Status: 201}, nil
		})
	}
	steps := []struct {
		name         string
		fp           string
		fail         bool
		wantErr      bool
		wantReplayed bool
	}{
		{"fn fails", "fp", true, true, false},
		{"new key", "fp", false, false, false},
		{"replay", "fp", false, false, true},
		{"mismatch", "other", false, true, false},
	}
	for _, s := range steps {
		r, err := call(s.fp, s.fail)
		if (err != nil) != s.wantErr || r.Replayed != s.wantReplayed {
			t.Fatalf("%s: got %+v, %v", s.name, r, err)
		}
		tr.check(t)
	}
	now = now.Add(2 * time.Hour) // expired: taken over
	if r, err := call("fp", false); err != nil || r.Replayed {
		t.Fatalf("expired key: got %+v, %v; want executed", r, err)
	}
	if n, err := f.store.Purge(ctx, now.Add(2*time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("Purge: got %d, %v; want 1", n, err)
	}
	tr.check(t)
	f.mustCount(t, ctx, "one", 2)
}

// TestLostRaceOnSameConnection: a caller that waited for the key and lost
// reads the record on the connection it holds, never asking for another.
func TestLostRaceOnSameConnection(t *testing.T) {
	t.Skip("obsolete since Guard waits in memory for same-key callers (flight.go): this test expects the callers of one Guard to queue in the database; to be rewritten with one Guard per caller")
	tr := &tracer{}
	pool := newPool(t, 2, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr })
	f := newFixture(t, pool, postgres.Config{})
	g := f.guard(t, nil)
	ctx := testContext(t)
	key := idempotency.Key{ID: "k"}
	held, release := make(chan struct{}), releaser(t)
	holder := make(chan error, 1)
	go func() {
		_, err := g.Do(context.WithValue(ctx, callerKey{}, 1), key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			if err := f.effect(ctx, tx, "held"); err != nil {
				return idempotency.Response{}, err
			}
			close(held)
			<-release.c
			return idempotency.Response{Status: 201, Body: []byte("holder")}, nil
		})
		holder <- err
	}()
	<-held
	waiter := make(chan error, 1)
	var resp idempotency.Response
	go func() {
		var err error
		resp, err = g.Do(context.WithValue(ctx, callerKey{}, 2), key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{}, errors.New("fn must not run for the waiter")
		})
		waiter <- err
	}()
	// The waiter is blocked in its INSERT once it shows up as blocked by
	// another backend (watched on a connection outside the pool of 2).
	waitBlocked(t, ctx, `%INSERT INTO "`+f.table+`"%`)
	release.do()
	if err := <-holder; err != nil {
		t.Fatalf("holder: %v", err)
	}
	if err := <-waiter; err != nil || !resp.Replayed || string(resp.Body) != "holder" {
		t.Fatalf("waiter: got %+v, %v; want the holder's response", resp, err)
	}
	tr.check(t)
	f.mustCount(t, ctx, "held", 1)
}

// waitBlocked returns once a backend running a statement LIKE pattern is
// blocked by another backend.
func waitBlocked(t testing.TB, ctx context.Context, pattern string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var blocked bool
		err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE cardinality(pg_blocking_pids(pid)) > 0 AND query LIKE $1)`, pattern).Scan(&blocked)
		if err != nil {
			t.Fatalf("watching for a blocked %q: %v", pattern, err)
		}
		if blocked {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// release is a channel closed by do, or at cleanup if the test ends first,
// so that no goroutine of a failed test stays blocked on it.
type release struct {
	c  chan struct{}
	do func()
}

func releaser(t testing.TB) release {
	c := make(chan struct{})
	r := release{c: c, do: sync.OnceFunc(func() { close(c) })}
	t.Cleanup(r.do)
	return r
}

// TestConflictInFnRetried: a deadlock met by fn's own statement is retried
// by Do (the store classifies it), so the caller gets the response and the
// effect commits once.
func TestConflictInFnRetried(t *testing.T) {
	ctx := testContext(t)
	f := newFixture(t, newPool(t, 2), postgres.Config{})
	g := f.guard(t, nil)
	var calls atomic.Int64
	resp, err := g.Do(ctx, idempotency.Key{ID: randomName("k")}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		if err := f.effect(ctx, tx, "pay"); err != nil {
			return idempotency.Response{}, err
		}
		if calls.Add(1) == 1 {
			// What a real deadlock returns from tx.Exec.
			return idempotency.Response{}, fmt.Errorf("charge: %w", &pgconn.PgError{Code: "40P01", Message: "deadlock detected"})
		}
		return idempotency.Response{Status: 201}, nil
	})
	if err != nil || resp.Status != 201 || calls.Load() != 2 {
		t.Fatalf("got %+v, %v after %d calls; want 201 after 2", resp, err, calls.Load())
	}
	f.mustCount(t, ctx, "pay", 1)
	// Any other database error from fn is returned as it is.
	_, err = g.Do(ctx, idempotency.Key{ID: randomName("k")}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		_, err := tx.Exec(ctx, "SELECT 1/0")
		return idempotency.Response{}, err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22012" || errors.Is(err, idempotency.ErrConflict) {
		t.Fatalf("division by zero in fn: got %v, want the 22012 error itself", err)
	}
}
