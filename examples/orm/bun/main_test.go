package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
)

func TestSQLite(t *testing.T) {
	testRollback(t, filepath.Join(t.TempDir(), "app.db"))
}

func TestMySQL(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	testRollback(t, "mysql:"+dsn)
}

func TestPostgres(t *testing.T) {
	testRollback(t, testenv.PostgresDSN(t))
}

func counts(t *testing.T, a *app, orders, keys string) (nOrders, nKeys int) {
	t.Helper()
	ctx := t.Context()
	if err := a.bun.QueryRowContext(ctx, "SELECT count(*) FROM ?", bun.Ident(orders)).Scan(&nOrders); err != nil {
		t.Fatal(err)
	}
	if err := a.bun.QueryRowContext(ctx, "SELECT count(*) FROM ?", bun.Ident(keys)).Scan(&nKeys); err != nil {
		t.Fatal(err)
	}
	return nOrders, nKeys
}

// An error in fn after bun's insert leaves neither the order nor the key;
// the retry with the same key then runs and commits both, once.
func testRollback(t *testing.T, store string) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	sfx := fmt.Sprintf("%d_%d", time.Now().UnixNano(), os.Getpid())
	orders, keys := "bun_orders_"+sfx, "bun_keys_"+sfx
	a, err := setup(ctx, store, orders, keys)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer a.close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, tb := range []string{orders, keys, keys + "_quota"} { // the postgres store's Migrate makes a quota table
			if _, err := a.bun.ExecContext(ctx, "DROP TABLE IF EXISTS ?", bun.Ident(tb)); err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
	})
	key := idempotency.Key{Scope: "customer-42", ID: "order-1"}
	order := Order{Customer: key.Scope, Amount: 1999}

	var inserted Order
	_, err = placeOrder(ctx, a.guard, a.bun, orders, key, order, func(o Order) error {
		inserted = o
		return errDeclined
	})
	if !errors.Is(err, errDeclined) {
		t.Fatalf("Do = %v, want errDeclined", err)
	}
	if inserted.ID == 0 {
		t.Fatal("fn did not insert through bun")
	}
	if o, k := counts(t, a, orders, keys); o != 0 || k != 0 {
		t.Fatalf("after the rollback: %d orders, %d keys; want 0 and 0", o, k)
	}

	first, err := placeOrder(ctx, a.guard, a.bun, orders, key, order, func(Order) error { return nil })
	if err != nil || first.Replayed {
		t.Fatalf("retry: %+v, %v; want a first execution", first, err)
	}
	again, err := placeOrder(ctx, a.guard, a.bun, orders, key, order, func(Order) error {
		t.Error("fn ran for a completed key")
		return nil
	})
	if err != nil || !again.Replayed || string(again.Body) != string(first.Body) {
		t.Fatalf("replay: %+v, %v; want %q replayed", again, err, first.Body)
	}
	if o, k := counts(t, a, orders, keys); o != 1 || k != 1 {
		t.Fatalf("after the commit: %d orders, %d keys; want 1 and 1", o, k)
	}
	var stored Order
	if err := a.bun.NewSelect().Model(&stored).ModelTableExpr("? AS ?TableAlias", bun.Ident(orders)).Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`{"order":%d}`, stored.ID); string(first.Body) != want || stored.Amount != 1999 {
		t.Errorf("body %s, stored %+v; want %s", first.Body, stored, want)
	}
}

// TestMain says, before the tests start, which server backends will not run
// here and the variable that enables each.
func TestMain(m *testing.M) { testenv.Main(m, testenv.MySQL, testenv.Postgres) }
