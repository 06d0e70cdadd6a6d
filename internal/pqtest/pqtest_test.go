// Package pqtest runs the database/sql front end of the postgres store
// (postgres.DBStore) on lib/pq. It is a module of its own so that lib/pq
// stays out of the core module's go.mod.
package pqtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lib/pq" // the "postgres" database/sql driver

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/conformance/faultproxy"
	"github.com/go-idempotency/idempotency/internal/pgdbtest"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/postgres"
)

// TestMain says, before the tests start, which server backends will not
// run here and the variable that enables each.
func TestMain(m *testing.M) { testenv.Main(m, testenv.Postgres) }

// TestConformance runs the shared suite on a DBStore over lib/pq, under
// each isolation level.
func TestConformance(t *testing.T) { pgdbtest.Conformance(t, "postgres", testenv.PostgresDSN(t)) }

// faultIdleTimeout is the idle_in_transaction_session_timeout of the fault
// fixtures' sessions, as in the postgres package's TestFaults.
const faultIdleTimeout = 1500 * time.Millisecond

// libpqBound is the fault suite's bound on lib/pq: the store's 3s, plus
// lib/pq's cancel request on a new connection (connect_timeout 1s in the
// fixtures) when the faulted call's context ends.
const libpqBound = 4 * time.Second

// libpqKnown names the fault suite's known failures on lib/pq: after a lost
// reply or under a partition, a call whose context ended does not return
// until its socket fails. lib/pq answers the ended context with a cancel
// request on a new connection, then keeps reading the old socket for the
// server's answer, which never comes through; the suite's rig cuts the
// socket 3s after the deadline, as the caller's operating system would in
// the end. pgx and its stdlib driver close the socket at once. Every other
// check (one effect, one answer, typed errors, the key free within the
// bound) still holds.
func libpqKnown(_ string, a faultproxy.Action, check string) string {
	if check == "deadline" && (a == faultproxy.DropReply || a == faultproxy.Partition) {
		return "lib/pq does not return on a cancelled context until the server answers or the socket fails"
	}
	return ""
}

// TestFaults runs the fault-injection suite on a DBStore over lib/pq, warm
// and cold.
func TestFaults(t *testing.T) {
	dsn := pgdbtest.WithParams(t, testenv.PostgresDSN(t), "connect_timeout=1")
	h := pgdbtest.FaultHarness(t, "postgres", dsn, faultIdleTimeout)
	h.Bound, h.Known = libpqBound, libpqKnown
	conformance.RunFaultsWarmAndCold(t, h)
}

// TestPgBouncer runs the shared suite and the fault suite on a DBStore over
// lib/pq through a PgBouncer in transaction mode, as the postgres
// package's TestDBPgBouncer does with pgx's stdlib driver. The DSN says
// binary_parameters=yes: without it lib/pq sends a statement with
// parameters as two exchanges (Parse, then Bind and Execute, each ending
// in its own Sync), which outside a transaction PgBouncer may send to two
// server connections ("unnamed prepared statement does not exist").
func TestPgBouncer(t *testing.T) {
	dsn := pgdbtest.StartPgBouncer(t, pgdbtest.BouncerOptions{PoolSize: 10, Lifetime: 1})
	dsn = pgdbtest.WithParams(t, dsn, "binary_parameters=yes")
	t.Run("ReadCommitted", func(t *testing.T) {
		conformance.Run(t, pgdbtest.Harness("postgres", dsn, postgres.Config{}))
	})
	// No fault suite here: a cancel request (lib/pq sends one for every
	// cancelled call) whose client leaves early kills PgBouncer 1.18
	// (Debian 12's: "bad client state: 0"). TestFaults runs it straight to
	// the server.
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

// TestErrorsMapped: lib/pq's *pq.Error reaches the store's one error
// mapping, as pgx's *pgconn.PgError does: a missing table is ErrSchema,
// and fn's serialization failures and deadlocks are conflicts to retry.
func TestErrorsMapped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := pgdbtest.Open(t, "postgres", testenv.PostgresDSN(t), 2)
	s, err := postgres.NewDB(db, &postgres.Config{Table: "pqtest_no_such_table"})
	if err != nil {
		t.Fatal(err)
	}
	txn, _, err := s.Reserve(ctx, backend.Reservation{Key: idempotency.Key{ID: "k"}, Fingerprint: "fp", TTL: time.Hour})
	if txn != nil {
		_ = txn.Rollback(ctx)
	}
	var pqErr *pq.Error
	if !errors.Is(err, idempotency.ErrSchema) || !errors.As(err, &pqErr) || pqErr.Code != "42P01" {
		t.Fatalf("Reserve on a missing table: %v; want ErrSchema with lib/pq's undefined_table in the chain", err)
	}
	for code, want := range map[pq.ErrorCode]bool{"40001": true, "40P01": true, "23505": false, "42P01": false} {
		if got := s.IsConflict(fmt.Errorf("fn: %w", &pq.Error{Code: code})); got != want {
			t.Errorf("IsConflict(%s) = %v, want %v", code, got, want)
		}
	}
}
