package idemqueue_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemqueue"
	"github.com/go-idempotency/idempotency/sqlite"
)

// A message delivered twice (the broker lost the first acknowledgement)
// is handled once: the redelivery replays the stored result, and both
// deliveries are acknowledged.
func ExampleProcess() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idemqueue-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlite.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE invoices (order_id TEXT NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}

	// The message's identity (a broker message id) becomes the key.
	key := idempotency.Key{Scope: "billing", ID: idemqueue.KeyID("msg-7f3a")}
	handle := func(tx *sql.Tx) ([]byte, error) {
		if _, err := tx.ExecContext(ctx, "INSERT INTO invoices (order_id) VALUES ('order-42')"); err != nil {
			return nil, err
		}
		return []byte("invoice for order-42"), nil
	}
	for delivery := 1; delivery <= 2; delivery++ {
		out, err := idemqueue.Process(ctx, guard, key, "order-42", handle)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("delivery %d: %s, replayed %v, %q\n", delivery, out.Verdict, out.Replayed, out.Body)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM invoices").Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("invoices:", n)
	// Output:
	// delivery 1: ack, replayed false, "invoice for order-42"
	// delivery 2: ack, replayed true, "invoice for order-42"
	// invoices: 1
}
