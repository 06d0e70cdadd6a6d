package redis_test

import (
	"context"
	"fmt"
	"net/http"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/redis"
)

// A transfer kept in Redis itself: the commands queued on tx are sent in the
// same MULTI/EXEC as the stored response, so a retry with the same key never
// moves the money twice. (It needs a Redis server, so it is not run.)
func Example() {
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()

	// The hash tag in the prefix keeps the store and the balances in one
	// slot, so that on Redis Cluster too they share a MULTI/EXEC.
	store, err := redis.New(client, &redis.Config{Prefix: "shop:{idem}:"})
	if err != nil {
		panic(err)
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		panic(err)
	}
	key := idempotency.Key{Scope: "customer-42", ID: "9f1c2a7e-order-17"}
	resp, err := guard.Do(ctx, key, idempotency.Fingerprint([]byte("POST /credit"), []byte("100")),
		func(tx *redis.Tx) (idempotency.Response, error) {
			tx.IncrBy(ctx, "shop:{idem}:balance:customer-42", 100)
			tx.RPush(ctx, "shop:{idem}:ledger:customer-42", "credit 100")
			return idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"credited":100}`)}, nil
		})
	if err != nil {
		panic(err)
	}
	fmt.Println(resp.Status, resp.Replayed)
}
