package outbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/postgres"
)

// An operation writes its effect and the event it publishes through the
// same transaction as its idempotency key.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	store, err := postgres.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	key := idempotency.Key{Scope: "customer-42", ID: "3f9c2a"}
	fp := "fingerprint"
	// readme:begin outbox-write
	ob, err := outbox.New(outbox.Postgres, nil) // table "outbox"; outbox.MySQL, outbox.SQLite
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.MigratePgx(ctx, pool); err != nil { // or ob.Schema() in your migrations
		log.Fatal(err)
	}
	resp, err := guard.Do(ctx, key, fp, func(tx pgx.Tx) (idempotency.Response, error) {
		var id int64
		if err := tx.QueryRow(ctx, "INSERT INTO payments (amount) VALUES (100) RETURNING id").Scan(&id); err != nil {
			return idempotency.Response{}, err
		}
		body := fmt.Appendf(nil, `{"id":%d}`, id)
		// Same tx: the event commits with the payment and the key, or not at all.
		err := ob.Write(ctx, tx, outbox.Event{
			Key:     key, // with Purpose, gives the event's Nats-Msg-Id: key.Derive("outbox", Purpose)
			Purpose: "payment.created",
			Subject: "payments.created",
			Payload: body,
		})
		return idempotency.Response{Status: 201, Body: body}, err
	})
	// readme:end outbox-write
	_, _ = resp, err
}
