package outboxnats_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/outboxnats"
)

// A relay publishing the outbox to JetStream until ctx ends.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app")
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
	ob, err := outbox.New(outbox.Postgres, nil)
	if err != nil {
		log.Fatal(err)
	}
	// readme:begin outbox-relay
	pub, err := outboxnats.NewPublisher(js, &outboxnats.Config{ExpectStream: "PAYMENTS"})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(ob, pool, pub, &outbox.RelayConfig{
		Batch:    100,         // rows per transaction: claim, publish, mark sent
		Interval: time.Second, // poll when idle
		OnError:  func(ctx context.Context, err error) { log.Print(err) },
	})
	if err != nil {
		log.Fatal(err)
	}
	go func() { // in as many processes as you like: FOR UPDATE SKIP LOCKED
		for range time.Tick(time.Hour) {
			_, _ = relay.PurgeSent(ctx, 24*time.Hour, 10000) // keep sent rows past the dedup window
		}
	}()
	log.Print(relay.Run(ctx)) // returns ctx.Err()
	// readme:end outbox-relay
}
