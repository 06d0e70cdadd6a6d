package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
)

func counts(t *testing.T, db *sql.DB, orders, keys string, key idempotency.Key) (nOrders, nKeys int) {
	t.Helper()
	ctx := t.Context()
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM `"+orders+"` WHERE customer = ?", key.Scope).Scan(&nOrders); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM `"+keys+"`").Scan(&nKeys); err != nil {
		t.Fatal(err)
	}
	return nOrders, nKeys
}

// An error in fn after GORM's insert leaves neither the order nor the key;
// the retry with the same key then runs and commits both, once.
func TestRollbackLeavesNeitherRowNorKey(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	sfx := fmt.Sprintf("%d_%d", time.Now().UnixNano(), os.Getpid())
	orders, keys := "gorm_orders_"+sfx, "gorm_keys_"+sfx
	g, gdb, db, err := setup(ctx, dsn, orders, keys)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, tb := range []string{orders, keys} {
			if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+tb+"`"); err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
	})
	key := idempotency.Key{Scope: "customer-42", ID: "order-1"}
	order := Order{Customer: key.Scope, Amount: 1999}

	var inserted Order
	_, err = placeOrder(ctx, g, gdb, orders, key, order, func(o Order) error {
		inserted = o
		return errDeclined
	})
	if !errors.Is(err, errDeclined) {
		t.Fatalf("Do = %v, want errDeclined", err)
	}
	if inserted.ID == 0 {
		t.Fatal("fn did not insert through GORM")
	}
	if o, k := counts(t, db, orders, keys, key); o != 0 || k != 0 {
		t.Fatalf("after the rollback: %d orders, %d keys; want 0 and 0", o, k)
	}

	first, err := placeOrder(ctx, g, gdb, orders, key, order, func(Order) error { return nil })
	if err != nil || first.Replayed {
		t.Fatalf("retry: %+v, %v; want a first execution", first, err)
	}
	again, err := placeOrder(ctx, g, gdb, orders, key, order, func(Order) error {
		t.Error("fn ran for a completed key")
		return nil
	})
	if err != nil || !again.Replayed || string(again.Body) != string(first.Body) {
		t.Fatalf("replay: %+v, %v; want %q replayed", again, err, first.Body)
	}
	if o, k := counts(t, db, orders, keys, key); o != 1 || k != 1 {
		t.Fatalf("after the commit: %d orders, %d keys; want 1 and 1", o, k)
	}
	// The row GORM wrote is the one the response names.
	var stored Order
	if err := gdb.WithContext(ctx).Table(orders).First(&stored).Error; err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`{"order":%d}`, stored.ID); string(first.Body) != want {
		t.Errorf("body %s, want %s", first.Body, want)
	}
}

// TestMain says, before the tests start, which server backends will not run
// here and the variable that enables each.
func TestMain(m *testing.M) { testenv.Main(m, testenv.MySQL) }
