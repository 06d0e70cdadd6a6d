package postgres_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/postgres/internal/dbtest"
)

// TestDBConformance runs the shared suite on the database/sql front end with
// pgx's stdlib driver, under each isolation level.
func TestDBConformance(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	t.Run("ReadCommitted", func(t *testing.T) {
		conformance.Run(t, dbtest.Harness("pgx", dsn, postgres.Config{}))
	})
	t.Run("TxOptionsSerializable", func(t *testing.T) {
		conformance.Run(t, dbtest.Harness("pgx", dsn, postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}))
	})
	t.Run("RepeatableRead", func(t *testing.T) {
		conformance.Run(t, dbtest.Harness("pgx", dbtest.WithParams(t, dsn, "default_transaction_isolation=repeatable read"), postgres.Config{}))
	})
	t.Run("LookupAlways", func(t *testing.T) {
		conformance.Run(t, dbtest.Harness("pgx", dsn, postgres.Config{Lookup: idempotency.LookupAlways}))
	})
}
