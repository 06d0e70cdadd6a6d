package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// BenchmarkStore compares Do with the bare effect transaction; see
// conformance.Benchmark and cmd/idembench.
func BenchmarkStore(b *testing.B) { conformance.Benchmark(b, harness(postgres.Config{})) }

// BenchmarkScale measures Do and Purge with a million keys in the table; see
// conformance.BenchmarkScale. It takes minutes:
//
//	go test -run '^$' -bench BenchmarkScale -benchtime 500x ./postgres
func BenchmarkScale(b *testing.B) { conformance.BenchmarkScale(b, harness(postgres.Config{})) }

// BenchmarkLookupAlways is BenchmarkStore with Config.Lookup LookupAlways
// (its own name, so that idembench's default pattern does not mix the two):
//
//	go test -run '^$' -bench BenchmarkLookupAlways -benchmem ./postgres | go run ./cmd/idembench -parse
func BenchmarkLookupAlways(b *testing.B) {
	conformance.Benchmark(b, harness(postgres.Config{Lookup: backend.LookupAlways}))
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
	t.Run("LookupAlways", func(t *testing.T) {
		conformance.Run(t, harness(postgres.Config{Lookup: backend.LookupAlways}))
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
// reaches fn's transaction, then runs directly the two cases where waiters
// meet serialization failures (40001) under the stricter levels: 20 callers
// of one key, and 20 callers whose winner fails while the others wait.
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
			ctx := testkit.Context(t, testTimeout)
			f := newFixture(t, newPool(t, 4, c.configure...), c.cfg)
			g := f.guard(t, nil)

			var level string
			_, err := g.Do(ctx, idempotency.Key{ID: testkit.Name("iso-")}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 200}, tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation')").Scan(&level)
			})
			if err != nil || level != c.want {
				t.Fatalf("fn's isolation level: got %q, %v; want %q", level, err, c.want)
			}

			for _, winnerFails := range []bool{false, true} {
				key := idempotency.Key{ID: testkit.Name("k-")}
				tag := fmt.Sprintf("winner-fails-%v", winnerFails)
				errFail := errors.New("the winner fails")
				var calls atomic.Int64
				results := make([]error, 20)
				replayed := make([]bool, 20)
				testkit.Together(len(results), func(i int) {
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
				testkit.MustCount(t, ctx, f.count, tag, 1)
			}
		})
	}
}

// faultIdleTimeout is the idle_in_transaction_session_timeout the fault
// fixtures' sessions run with: a session whose client vanished behind a
// partition (the server never sees the connection close) is ended by the
// server this long after its last statement, which releases the key.
// Without it the key stays held until TCP keepalives notice, by default
// more than two hours later.
const faultIdleTimeout = 1500 * time.Millisecond

// TestFaults runs the fault-injection suite (a cut connection, a lost
// reply, a partition and a slow step at every round trip of a call) on a
// warm and on a cold pool: see conformance.RunFaultsWarmAndCold.
func TestFaults(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	upstream := faultUpstream(t, dsn)
	conformance.RunFaultsWarmAndCold(t, conformance.FaultHarness[pgx.Tx]{
		Upstream: upstream,
		NewFixture: func(t testing.TB, addr, ns string) conformance.Fixture[pgx.Tx] {
			f := faultFixture(t, dsn, addr, ns, faultIdleTimeout, addr == upstream)
			if os.Getenv(brokenEnv) == "1" {
				f.Store = lyingStore{f.Store}
			}
			return f
		},
		CallTimeout:    time.Second,
		Bound:          3 * time.Second,
		PartitionBound: faultIdleTimeout + 1500*time.Millisecond,
	})
}

// brokenEnv makes TestFaults run on [lyingStore], for
// TestFaultsFailBrokenStore.
const brokenEnv = "IDEMPOTENCY_FAULTS_LYING_STORE"

// TestFaultsFailBrokenStore shows that the fault suite fails a store that
// acknowledges a completion it could not commit: it runs the COMMIT's
// scenarios of TestFaults on [lyingStore] in a child process and expects
// them to fail, naming the two answers given for one key.
func TestFaultsFailBrokenStore(t *testing.T) {
	testenv.PostgresDSN(t)
	if os.Getenv(brokenEnv) == "1" {
		t.Skip("running TestFaults on the lying store")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestFaults$/^Warm$/^(Trace|complete#1)$/^CutBefore$", "-test.v")
	cmd.Env = append(os.Environ(), brokenEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("TestFaults on a lying store: %v (want a failing test run)\n%s", err, out)
	}
	// The suite names the two answers from whichever pair of callers it
	// compares first: the faulted call and the retry, or a caller of the
	// faulted Guard that ran fn again once the lie left the key free.
	twoAnswers := regexp.MustCompile(`both ran fn: two answers for one key|ran fn too \(.*\): two executions answered|the faulted call answered .*, the retry `)
	if !twoAnswers.Match(out) {
		t.Fatalf("TestFaults on a lying store failed, but not for its two answers:\n%s", out)
	}
}

// lyingStore is a deliberately broken store: its Complete reports success
// whatever the COMMIT did, so a caller is told an answer that was never
// stored.
type lyingStore struct{ idempotency.KeyStore[pgx.Tx] }

func (s lyingStore) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[pgx.Tx], *backend.Record, error) {
	txn, rec, err := s.KeyStore.Reserve(ctx, r)
	if txn != nil {
		txn = lyingTxn{txn}
	}
	return txn, rec, err
}

type lyingTxn struct{ backend.Txn[pgx.Tx] }

func (t lyingTxn) Complete(ctx context.Context, resp idempotency.Response) error {
	_ = t.Txn.Complete(ctx, resp)
	return nil
}

// TestFaultsWithoutIdleTimeout runs the suite (but its partitions) on
// sessions without idle_in_transaction_session_timeout, warm and cold: after
// a lost reply, the key must be free soon after the faulted caller's
// deadline without the server's help, since the store closes the socket of
// a connection whose statement's ctx ended at once. (pgx alone closes it in
// the background after sending Terminate, which the stalled connection
// never delivers, and waiting up to 15s for the server: the session, its
// transaction and the key's lock lived that long.)
func TestFaultsWithoutIdleTimeout(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	upstream := faultUpstream(t, dsn)
	conformance.RunFaultsWarmAndCold(t, conformance.FaultHarness[pgx.Tx]{
		Upstream: upstream,
		NewFixture: func(t testing.TB, addr, ns string) conformance.Fixture[pgx.Tx] {
			return faultFixture(t, dsn, addr, ns, 0, addr == upstream)
		},
		CallTimeout: time.Second,
		Bound:       3 * time.Second,
		// No partitions: without an idle timeout the server holds a
		// partitioned session's key until TCP keepalives notice (hours).
	})
}

// faultFixture is a store on table faults_<ns> and an effects table
// faults_<ns>_fx, on a pool that dials addr, whose sessions run with
// idle_in_transaction_session_timeout = idle (none if 0). The fixture on the
// server itself (owner) creates both tables and drops them at cleanup.
func faultFixture(t testing.TB, dsn, addr, ns string, idle time.Duration, owner bool) conformance.Fixture[pgx.Tx] {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(p), nil
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	if idle > 0 {
		cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.Itoa(int(idle.Milliseconds()))
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	table := "faults_" + ns
	effects := pgx.Identifier{table + "_fx"}.Sanitize()
	store, err := postgres.New(pool, &postgres.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if owner {
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+effects+` (n BIGSERIAL PRIMARY KEY, tag TEXT NOT NULL)`); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if owner {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+effects+`, `+pgx.Identifier{table}.Sanitize())
		}
		pool.Close()
	})
	return conformance.Fixture[pgx.Tx]{
		Store: store,
		Effect: func(ctx context.Context, tx pgx.Tx, tag string) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (tag) VALUES ($1)`, tag)
			return err
		},
		Count: func(ctx context.Context, tag string) (int, error) {
			var n int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM `+effects+` WHERE tag = $1`, tag).Scan(&n)
			return n, err
		},
	}
}

// faultUpstream is the host:port of the server dsn names.
func faultUpstream(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
}
