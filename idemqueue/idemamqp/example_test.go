package idemamqp_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemqueue/idemamqp"
	"github.com/go-idempotency/idempotency/postgres"
)

// A RabbitMQ consumer whose effect runs once per message-id, with poison
// messages dead-lettered by a quorum queue's delivery limit.
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
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	// readme:begin queues-amqp
	_, err = ch.QueueDeclare("orders", true, false, false, false, amqp.Table{
		"x-queue-type":              "quorum",
		"x-delivery-limit":          4,             // then dead-lettered: the handler ran 5 times
		"x-dead-letter-exchange":    "",            // the default exchange ...
		"x-dead-letter-routing-key": "orders.dead", // ... routes it to this queue
	})
	if err != nil {
		log.Fatal(err)
	}
	billing, err := idemamqp.New(guard,
		func(ctx context.Context, tx pgx.Tx, d *amqp.Delivery) ([]byte, error) {
			_, err := tx.Exec(ctx, "INSERT INTO invoices (order_json) VALUES ($1)", d.Body)
			return []byte("invoiced"), err
		},
		&idemamqp.Config{Scope: "billing"}) // key: the message-id property
	if err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("orders", "", false, false, false, false, nil) // autoAck false
	if err != nil {
		log.Fatal(err)
	}
	if err := billing.Run(ctx, deliveries); err != nil {
		log.Fatal(err)
	}
	// readme:end queues-amqp
}
