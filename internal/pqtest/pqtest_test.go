// Package pqtest runs the database/sql front end of the postgres store
// (postgres.DBStore) on lib/pq. It is a module of its own so that lib/pq
// stays out of the core module's go.mod.
package pqtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/lib/pq" // the "postgres" database/sql driver

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/internal/pgdbtest"
)

// TestMain says, before the tests start, which server backends will not
// run here and the variable that enables each.
func TestMain(m *testing.M) { testenv.Main(m, testenv.Postgres) }

// TestConformance runs the shared suite on a DBStore over lib/pq, under
// each isolation level.
func TestConformance(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	t.Run("ReadCommitted", func(t *testing.T) {
		conformance.Run(t, pgdbtest.Harness("postgres", dsn, postgres.Config{}))
	})
	t.Run("TxOptionsSerializable", func(t *testing.T) {
		conformance.Run(t, pgdbtest.Harness("postgres", dsn, postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}))
	})
	t.Run("LookupAlways", func(t *testing.T) {
		conformance.Run(t, pgdbtest.Harness("postgres", dsn, postgres.Config{Lookup: idempotency.LookupAlways}))
	})
}

// faultIdleTimeout is the idle_in_transaction_session_timeout of the fault
// fixtures' sessions, as in the postgres package's TestFaults.
const faultIdleTimeout = 1500 * time.Millisecond

// TestFaults runs the fault-injection suite on a DBStore over lib/pq, warm
// and cold.
func TestFaults(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	conformance.RunFaultsWarmAndCold(t, pgdbtest.FaultHarness(t, "postgres", dsn, faultIdleTimeout))
}

// TestPgBouncer runs the shared suite and the fault suite on a DBStore over
// lib/pq through a PgBouncer in transaction mode, as the postgres
// package's TestDBPgBouncer does with pgx's stdlib driver. lib/pq sends
// unnamed statements: the DSN needs nothing.
func TestPgBouncer(t *testing.T) {
	dsn := pgdbtest.StartPgBouncer(t, pgdbtest.BouncerOptions{PoolSize: 10, Lifetime: 1})
	t.Run("ReadCommitted", func(t *testing.T) {
		conformance.Run(t, pgdbtest.Harness("postgres", dsn, postgres.Config{}))
	})
	t.Run("Faults", func(t *testing.T) {
		dsn := pgdbtest.StartPgBouncer(t, pgdbtest.BouncerOptions{PoolSize: 10, Lifetime: 1,
			ConnectQuery: fmt.Sprintf("SET idle_in_transaction_session_timeout = %d", faultIdleTimeout.Milliseconds())})
		h := pgdbtest.FaultHarness(t, "postgres", dsn, 0) // PgBouncer's connect_query sets the idle timeout
		h.PartitionBound = faultIdleTimeout + 1500*time.Millisecond
		conformance.RunFaultsWarmAndCold(t, h)
	})
}

// BenchmarkStore is the postgres package's BenchmarkDBStore on lib/pq: its
// Bare is a plain *sql.Tx of the same *sql.DB. Run it and read it with
// idembench:
//
//	go test -run '^$' -bench . -benchmem -count 3 . | go run ../../cmd/idembench -parse
func BenchmarkStore(b *testing.B) {
	conformance.Benchmark(b, pgdbtest.Harness("postgres", testenv.PostgresDSN(b), postgres.Config{}))
}

// BenchmarkBinaryParameters is BenchmarkStore with binary_parameters=yes
// in the DSN, with which lib/pq sends a statement with parameters in one
// round trip instead of two.
func BenchmarkBinaryParameters(b *testing.B) {
	dsn := pgdbtest.WithParams(b, testenv.PostgresDSN(b), "binary_parameters=yes")
	conformance.Benchmark(b, pgdbtest.Harness("postgres", dsn, postgres.Config{}))
}
