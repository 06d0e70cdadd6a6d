package postgres_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
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
	conformance.Benchmark(b, harness(postgres.Config{Lookup: idempotency.LookupAlways}))
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
		conformance.Run(t, harness(postgres.Config{Lookup: idempotency.LookupAlways}))
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
