package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/examples/orm/sqlc/db"
	"github.com/go-idempotency/idempotency/internal/testenv"
)

// newPool returns a pool whose connections work in a new schema of their
// own (search_path), dropped when the test ends: the generated queries name
// the table "orders" unqualified.
func newPool(t *testing.T) *pgxpool.Pool {
	dsn := testenv.PostgresDSN(t)
	ctx := t.Context()
	schema := fmt.Sprintf("orm_sqlc_%d_%d", time.Now().UnixNano(), os.Getpid())
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
		admin.Close(ctx)
	})
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func counts(t *testing.T, pool *pgxpool.Pool, key idempotency.Key) (orders, keys int) {
	t.Helper()
	ctx := t.Context()
	n, err := db.New(pool).CountOrders(ctx, key.Scope)
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys WHERE scope = $1 AND id = $2", key.Scope, key.ID).Scan(&keys); err != nil {
		t.Fatal(err)
	}
	return int(n), keys
}

// An error in fn after sqlc's insert leaves neither the order nor the key;
// the retry with the same key then runs and commits both, once.
func TestRollbackLeavesNeitherRowNorKey(t *testing.T) {
	pool := newPool(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	g, err := setup(ctx, pool, "idempotency_keys")
	if err != nil {
		t.Fatal(err)
	}
	queries := db.New(pool)
	key := idempotency.Key{Scope: "customer-42", ID: "order-1"}

	var inserted db.Order
	_, err = placeOrder(ctx, g, queries, key, key.Scope, 1999, func(o db.Order) error {
		inserted = o
		return errDeclined
	})
	if !errors.Is(err, errDeclined) {
		t.Fatalf("Do = %v, want errDeclined", err)
	}
	if inserted.ID == 0 {
		t.Fatal("fn did not insert through sqlc")
	}
	if orders, keys := counts(t, pool, key); orders != 0 || keys != 0 {
		t.Fatalf("after the rollback: %d orders, %d keys; want 0 and 0", orders, keys)
	}

	ok := func(db.Order) error { return nil }
	first, err := placeOrder(ctx, g, queries, key, key.Scope, 1999, ok)
	if err != nil || first.Replayed {
		t.Fatalf("retry: %+v, %v; want a first execution", first, err)
	}
	again, err := placeOrder(ctx, g, queries, key, key.Scope, 1999, func(db.Order) error {
		t.Error("fn ran for a completed key")
		return nil
	})
	if err != nil || !again.Replayed || string(again.Body) != string(first.Body) {
		t.Fatalf("replay: %+v, %v; want %q replayed", again, err, first.Body)
	}
	if want := fmt.Sprintf(`{"order":%d}`, inserted.ID+1); string(first.Body) != want {
		t.Errorf("body %s, want %s (the sequence moved on; the rolled-back row is gone)", first.Body, want)
	}
	if orders, keys := counts(t, pool, key); orders != 1 || keys != 1 {
		t.Fatalf("after the commit: %d orders, %d keys; want 1 and 1", orders, keys)
	}
}

// TestMain says, before the tests start, which server backends will not run
// here and the variable that enables each.
func TestMain(m *testing.M) { testenv.Main(m, testenv.Postgres) }
