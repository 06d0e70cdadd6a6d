package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// TestRunSerializableRetryForgetsStepData: under SERIALIZABLE, a Local
// step's commit fails with a serialization failure (write skew with
// another transaction) and the core runs the step again: what the failed
// attempt set in State was rolled back with its writes, so the retry
// writes the order again and the answer names a committed order.
func TestRunSerializableRetryForgetsStepData(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newFixture(t, newPool(t, 4), postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}})
	other := testkit.Name("idem_a_")
	pgkit.DropAtCleanup(t, testenv.PostgresDSN(t), "TABLE", other)
	if _, err := f.pool.Exec(ctx, "CREATE TABLE "+other+" (n int)"); err != nil {
		t.Fatal(err)
	}
	g := f.guard(t, nil)
	attempts := 0
	op := &idempotency.Operation[pgx.Tx]{
		Name: "pay",
		Steps: []idempotency.Step[pgx.Tx]{
			{Name: "first", Local: func(ctx context.Context, tx pgx.Tx, _ *idempotency.State) error { return f.effect(ctx, tx, "first") }},
			{Name: "order", Local: func(ctx context.Context, tx pgx.Tx, s *idempotency.State) error {
				attempts++
				var n int
				if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+other).Scan(&n); err != nil {
					return err
				}
				if s.Get("order") == "" { // create the order once
					if err := f.effect(ctx, tx, "order"); err != nil {
						return err
					}
					s.Set("order", "o-1")
				}
				if attempts == 1 { // a concurrent transaction: write skew
					otx, err := f.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
					if err != nil {
						return err
					}
					defer otx.Rollback(ctx)
					if err := otx.QueryRow(ctx, "SELECT count(*) FROM "+f.effects+" WHERE tag = 'order'").Scan(&n); err != nil {
						return err
					}
					if _, err := otx.Exec(ctx, "INSERT INTO "+other+" VALUES (1)"); err != nil {
						return err
					}
					if err := otx.Commit(ctx); err != nil {
						return fmt.Errorf("other commit: %w", err)
					}
				}
				return nil
			}},
		},
		Finish: func(_ context.Context, _ pgx.Tx, s *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte(s.Get("order"))}, nil
		},
	}
	resp, err := g.Run(ctx, idempotency.Key{Scope: "s", ID: "k"}, "fp", nil, op)
	orders, cerr := f.count(ctx, "order")
	if err != nil || cerr != nil || resp.Status != 201 || string(resp.Body) != "o-1" || attempts != 2 || orders != 1 {
		t.Fatalf("run: %d %q, %v; the step ran %d times, orders committed %d (%v); want 201 o-1, 2 runs (one serialization failure), 1 order",
			resp.Status, resp.Body, err, attempts, orders, cerr)
	}
}

// TestRunStopsWhenForgotten: an operator forgets an unfinished key whose
// lease ran out during its run's slow Foreign step: the run stops with
// ErrNotFound instead of starting the operation over (a second order, a
// second call).
func TestRunStopsWhenForgotten(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newFixture(t, newPool(t, 4), postgres.Config{})
	g := f.guard(t, nil)
	key := idempotency.Key{Scope: "s", ID: "k"}
	var forgetErr error
	calls := 0
	op := &idempotency.Operation[pgx.Tx]{
		Name:  "pay",
		Lease: 100 * time.Millisecond,
		Steps: []idempotency.Step[pgx.Tx]{
			{Name: "order", Local: func(ctx context.Context, tx pgx.Tx, _ *idempotency.State) error { return f.effect(ctx, tx, "order") }},
			{Name: "charge", Foreign: func(ctx context.Context, _ *idempotency.State) error {
				calls++
				if calls == 1 {
					time.Sleep(300 * time.Millisecond) // slower than the lease
					_, forgetErr = f.store.Forget(ctx, key)
				}
				return nil
			}},
		},
		Finish: func(context.Context, pgx.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 200}, nil
		},
	}
	_, err := g.Run(ctx, key, "fp", nil, op)
	orders, cerr := f.count(ctx, "order")
	if forgetErr != nil || !errors.Is(err, idempotency.ErrNotFound) || cerr != nil || orders != 1 || calls != 1 {
		t.Fatalf("run: %v; forget: %v; orders %d (%v); charge calls %d; want ErrNotFound after the Forget, 1 order, 1 call", err, forgetErr, orders, cerr, calls)
	}
}
