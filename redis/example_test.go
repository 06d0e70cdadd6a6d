package redis_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/readmekit"
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

// readmeQuickStart is the README's Redis quick start: it credits amount to
// the key's scope once per key, the effect kept in Redis itself.
func readmeQuickStart(ctx context.Context, addr string, key idempotency.Key, fp string, amount int64) (idempotency.Response, error) {
	// readme:begin readme-quickstart-redis
	client := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true}) // addr: "127.0.0.1:6379"
	defer client.Close()
	// The hash tag {idem} keeps the records and the balances in one Cluster slot.
	store, err := redis.New(client, &redis.Config{Prefix: "shop:{idem}:"})
	if err != nil {
		return idempotency.Response{}, err
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		return idempotency.Response{}, err
	}

	return guard.Do(ctx, key, fp, func(tx *redis.Tx) (idempotency.Response, error) {
		// Queued, not sent: it runs in the MULTI/EXEC that stores the response.
		tx.IncrBy(ctx, "shop:{idem}:balance:"+key.Scope, amount)
		return idempotency.Response{Status: 201, Body: fmt.Appendf(nil, `{"credited":%d}`, amount)}, nil
	})
	// readme:end readme-quickstart-redis
}

// TestReadmeQuickStart runs the README's quick start: one credit for two
// calls with one key, and the same key with another request refused.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel()
	addr := testenv.RedisAddr(t)
	ctx := testkit.Context(t, 30*time.Second)
	client := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { _ = client.Close() })
	key := idempotency.Key{Scope: testkit.Name("customer-"), ID: "order-42"}
	balance := "shop:{idem}:balance:" + key.Scope
	t.Cleanup(func() { _ = client.Del(context.Background(), balance).Err() })
	readmekit.CheckQuickStart(t, func(fp string, amount int) (idempotency.Response, error) {
		return readmeQuickStart(ctx, addr, key, fp, int64(amount))
	})
	got, err := client.Get(ctx, balance).Int64()
	if err != nil {
		t.Fatal(err)
	}
	if got != 1999 {
		t.Errorf("balance %d, want 1999: one credit", got)
	}
}
