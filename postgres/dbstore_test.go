package postgres_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/pgdbtest"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/postgres"
)

// TestDBConformance runs the shared suite on the database/sql front end with
// pgx's stdlib driver, under each isolation level.
func TestDBConformance(t *testing.T) { pgdbtest.Conformance(t, "pgx", testenv.PostgresDSN(t)) }

// TestDBFaults runs the fault-injection suite on the database/sql front end
// with pgx's stdlib driver, warm and cold, as TestFaults does on the pgx
// front end.
func TestDBFaults(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	conformance.RunFaultsWarmAndCold(t, pgdbtest.FaultHarness(t, "pgx", dsn, faultIdleTimeout))
}

// TestDBPgBouncer runs the shared suite and the fault suite on the
// database/sql front end with pgx's stdlib driver through a PgBouncer in
// transaction mode, as TestPgBouncerConformance and TestPgBouncerFaults do
// on the pgx front end. The DSN names the exec mode docs/deployments.md
// names: through database/sql the store's statements use the driver's.
func TestDBPgBouncer(t *testing.T) {
	dsn := startPgBouncer(t, bouncerOptions{PoolSize: 10, Lifetime: 1}) + "&default_query_exec_mode=exec"
	t.Run("ReadCommitted", func(t *testing.T) {
		conformance.Run(t, pgdbtest.Harness("pgx", dsn, postgres.Config{}))
	})
	t.Run("Serializable", func(t *testing.T) {
		conformance.Run(t, pgdbtest.Harness("pgx", dsn, postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}))
	})
	// No fault suite here: with the database/sql front end, a cancel
	// request whose client leaves early kills PgBouncer 1.18 (Debian 12's:
	// "FATAL ... disconnect_client(): bad client state: 0"), which then
	// fails every later case. The fault suite runs on this store straight
	// to the server (TestDBFaults) and behind PgBouncer on the pgx front
	// end (TestPgBouncerFaults).
}

// BenchmarkDBStore is BenchmarkStore on the database/sql front end with
// pgx's stdlib driver: its Bare is a plain *sql.Tx of the same *sql.DB. See
// cmd/idembench, which measures both.
func BenchmarkDBStore(b *testing.B) {
	conformance.Benchmark(b, pgdbtest.Harness("pgx", testenv.PostgresDSN(b), postgres.Config{}))
}
