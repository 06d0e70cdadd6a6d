package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
)

// counts counts through GORM, which quotes the names as each database
// wants.
func counts(t *testing.T, gdb *gorm.DB, orders, keys string, key idempotency.Key) (nOrders, nKeys int) {
	t.Helper()
	ctx := t.Context()
	var o, k int64
	if err := gdb.WithContext(ctx).Table(orders).Where("customer = ?", key.Scope).Count(&o).Error; err != nil {
		t.Fatal(err)
	}
	if err := gdb.WithContext(ctx).Table(keys).Count(&k).Error; err != nil {
		t.Fatal(err)
	}
	return int(o), int(k)
}

// An error in fn after GORM's insert leaves neither the order nor the key;
// the retry with the same key then runs and commits both, once: on MySQL
// and on PostgreSQL.
func TestRollbackLeavesNeitherRowNorKey(t *testing.T) {
	t.Run("MySQL", func(t *testing.T) { testRollback(t, testenv.MySQLDSN(t)) })
	t.Run("PostgreSQL", func(t *testing.T) { testRollback(t, testenv.PostgresDSN(t)) })
}

func testRollback(t *testing.T, dsn string) {
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
		for _, tb := range []string{orders, keys, keys + "_quota"} { // the postgres store's Migrate makes a quota table
			if err := gdb.WithContext(ctx).Migrator().DropTable(tb); err != nil {
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
	if o, k := counts(t, gdb, orders, keys, key); o != 0 || k != 0 {
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
	if o, k := counts(t, gdb, orders, keys, key); o != 1 || k != 1 {
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
func TestMain(m *testing.M) { testenv.Main(m, testenv.MySQL, testenv.Postgres) }
