package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
)

func TestSQLite(t *testing.T) { testRollback(t, filepath.Join(t.TempDir(), "app.db")) }

func TestMySQL(t *testing.T) { testRollback(t, "mysql:"+testenv.MySQLDSN(t)) }

func TestPostgres(t *testing.T) { testRollback(t, testenv.PostgresDSN(t)) }

func counts(t *testing.T, a *app, orders, keys string) (nOrders, nKeys int) {
	t.Helper()
	if err := a.db.GetContext(t.Context(), &nOrders, "SELECT count(*) FROM "+orders); err != nil {
		t.Fatal(err)
	}
	if err := a.db.GetContext(t.Context(), &nKeys, "SELECT count(*) FROM "+keys); err != nil {
		t.Fatal(err)
	}
	return nOrders, nKeys
}

// An error in fn after sqlx's insert leaves neither the order nor the key;
// the retry with the same key then runs and commits both, once.
func testRollback(t *testing.T, store string) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	sfx := fmt.Sprintf("%d_%d", time.Now().UnixNano(), os.Getpid())
	orders, keys := "sqlx_orders_"+sfx, "sqlx_keys_"+sfx
	a, err := setup(ctx, store, orders, keys)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer a.close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, tb := range []string{orders, keys, keys + "_quota"} { // the postgres store's Migrate makes a quota table
			if _, err := a.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+tb); err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
	})
	key := idempotency.Key{Scope: "customer-42", ID: "order-1"}
	order := Order{ID: "o-1", Customer: key.Scope, Amount: 1999}

	ran := false
	_, err = placeOrder(ctx, a.guard, a.db, orders, key, order, func(Order) error {
		ran = true
		return errDeclined
	})
	if !errors.Is(err, errDeclined) || !ran {
		t.Fatalf("Do = %v (check ran: %v), want errDeclined", err, ran)
	}
	if o, k := counts(t, a, orders, keys); o != 0 || k != 0 {
		t.Fatalf("after the rollback: %d orders, %d keys; want 0 and 0", o, k)
	}

	first, err := placeOrder(ctx, a.guard, a.db, orders, key, order, func(Order) error { return nil })
	if err != nil || first.Replayed || string(first.Body) != `{"order":"o-1"}` {
		t.Fatalf("retry: %+v, %v; want a first execution", first, err)
	}
	again, err := placeOrder(ctx, a.guard, a.db, orders, key, order, func(Order) error {
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
	if err := a.db.GetContext(ctx, &stored, a.db.Rebind("SELECT id, customer, amount FROM "+orders+" WHERE id = ?"), "o-1"); err != nil {
		t.Fatal(err)
	}
	if stored != order {
		t.Errorf("stored %+v, want %+v", stored, order)
	}
}

// TestMain says, before the tests start, which server backends will not run
// here and the variable that enables each.
func TestMain(m *testing.M) { testenv.Main(m, testenv.MySQL, testenv.Postgres) }
