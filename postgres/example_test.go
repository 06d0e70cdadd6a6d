package postgres_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/postgres"
)

// A payment runs once per idempotency key: the payment row, the key and the
// response commit in one transaction. (It needs a server, so it is only
// compiled.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := postgres.New(pool, &postgres.Config{Table: "idempotency_keys"})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}

	body := []byte(`{"amount": 100, "currency": "EUR"}`)
	fp, err := idempotency.FingerprintJSON(body)
	if err != nil {
		log.Fatal(err)
	}
	key := idempotency.Key{Scope: "customer-42", ID: "3f1c9a7e-order-7"}
	resp, err := guard.Do(ctx, key, fp, func(tx pgx.Tx) (idempotency.Response, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO payments (customer, amount) VALUES ($1, $2) RETURNING id`, "customer-42", 100).Scan(&id)
		if err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{
			Status: http.StatusCreated,
			Header: http.Header{"Content-Type": {"application/json"}},
			Body:   fmt.Appendf(nil, `{"payment": %d}`, id),
		}, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.Status, resp.Replayed)
}

// The DDL of a keys table, for a migration tool.
func ExampleSchema() {
	ddl, err := postgres.Schema("billing.idempotency_keys")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(ddl)
	// Output:
	// CREATE TABLE IF NOT EXISTS "billing"."idempotency_keys" (
	// 	scope       TEXT COLLATE "C" NOT NULL,
	// 	id          TEXT COLLATE "C" NOT NULL,
	// 	fingerprint TEXT NOT NULL,
	// 	state       TEXT NOT NULL CHECK (state IN ('pending', 'completed')),
	// 	status      INTEGER,
	// 	header      BYTEA,
	// 	body        BYTEA,
	// 	created_at  TIMESTAMPTZ NOT NULL,
	// 	expires_at  TIMESTAMPTZ NOT NULL,
	// 	PRIMARY KEY (scope, id)
	// );
	// CREATE INDEX IF NOT EXISTS "idempotency_keys_expires_at_idx" ON "billing"."idempotency_keys" (expires_at);
}
