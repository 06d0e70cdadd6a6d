package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/sqlite"
)

// The event is written through the key's transaction on SQLite, then a
// relay publishes it. Two calls with one key write it once.
func ExampleNewSQLRelay() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "outbox-example")
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
	ob, err := outbox.New(outbox.SQLite, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}

	key := idempotency.Key{Scope: "customer-42", ID: "order-7"}
	for range 2 { // a retry of the same request
		resp, err := guard.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
			body := []byte(`{"order":7}`)
			err := ob.WriteSQL(ctx, tx, outbox.Event{Key: key, Purpose: "order.placed", Subject: "orders.placed", Payload: body})
			return idempotency.Response{Status: 201, Body: body}, err
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.Status, "replayed:", resp.Replayed)
	}

	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) error {
		for _, m := range msgs {
			fmt.Printf("publish %s %s\n", m.Subject, m.Payload)
		}
		return nil
	})
	relay, err := outbox.NewSQLRelay(ob, db, pub, nil)
	if err != nil {
		log.Fatal(err)
	}
	n, err := relay.RunOnce(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("sent:", n)
	// Output:
	// 201 replayed: false
	// 201 replayed: true
	// publish orders.placed {"order":7}
	// sent: 1
}
