package idemnats_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemqueue/idemnats"
	"github.com/go-idempotency/idempotency/postgres"
)

// A JetStream consumer whose effect runs once per message, however often
// the message is delivered.
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
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	// readme:begin queues-nats
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable:    "billing",
		AckPolicy:  jetstream.AckExplicitPolicy,
		AckWait:    30 * time.Second,
		MaxDeliver: 5, // a poison message stops after 5 deliveries (MAX_DELIVERIES advisory)
	})
	if err != nil {
		log.Fatal(err)
	}
	billing, err := idemnats.New(guard,
		func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) ([]byte, error) {
			// Every write through tx: it commits with the message's key.
			_, err := tx.Exec(ctx, "INSERT INTO invoices (order_json) VALUES ($1)", msg.Data())
			return []byte("invoiced"), err // the stored result, replayed on redelivery
		},
		&idemnats.Config{Scope: "billing"}) // key: Nats-Msg-Id, else stream sequence
	if err != nil {
		log.Fatal(err)
	}
	cc, err := cons.Consume(billing.MessageHandler(ctx))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Stop()
	// readme:end queues-nats
}
