package redis_test

import (
	"context"
	"crypto/rand"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/redis"
)

func TestReplicationConfig(t *testing.T) {
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer client.Close()
	for _, cfg := range []redis.Config{
		{WaitReplicas: -1},
		{WaitReplicas: 1, ReplicaTimeout: -time.Second},
		{WaitReplicas: 1, ReplicaTimeout: time.Microsecond},
	} {
		if _, err := redis.New(client, &cfg); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("New(%+v): got %v, want ErrInvalidConfig", cfg, err)
		}
	}
	if _, err := redis.New(client, &redis.Config{WaitReplicas: 2}); err != nil {
		t.Errorf("WaitReplicas 2, default timeout: %v", err)
	}
}

// TestWaitReplicasWithoutReplica: on a server with no replica, a store that
// asks for one refuses to answer (ErrNotReplicated) after ReplicaTimeout;
// the completion was applied on the server, so a retry there replays it.
// (internal/clusters' TestRedisFailover runs it against a real replica and a
// failover.)
func TestWaitReplicasWithoutReplica(t *testing.T) {
	addr := testenv.RedisAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := goredis.NewClient(&goredis.Options{Addr: addr})
	defer client.Close()
	if n, err := client.Info(ctx, "replication").Result(); err != nil {
		t.Fatal(err)
	} else if !slices.Contains(strings.Split(strings.ReplaceAll(n, "\r", ""), "\n"), "connected_slaves:0") {
		t.Skip("the test server has replicas; this test needs one without")
	}
	prefix := "idemtest:{" + rand.Text()[:10] + "}:"
	t.Cleanup(func() {
		keys, _ := client.Keys(context.Background(), prefix+"*").Result()
		if len(keys) > 0 {
			_ = client.Del(context.Background(), keys...).Err()
		}
	})
	store, err := redis.New(client, &redis.Config{Prefix: prefix, WaitReplicas: 1, ReplicaTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.New(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := idempotency.Key{ID: "k"}
	runs := 0
	fn := func(tx *redis.Tx) (idempotency.Response, error) {
		runs++
		tx.Incr(ctx, tx.Key("effect"))
		return idempotency.Response{Status: 201, Body: []byte("done")}, nil
	}
	start := time.Now()
	_, err = g.Do(ctx, key, "fp", fn)
	if !errors.Is(err, redis.ErrNotReplicated) {
		t.Fatalf("no replica, WaitReplicas 1: got %v, want ErrNotReplicated", err)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("refused after %v, before ReplicaTimeout", d)
	}
	// A replay is not answered before a replica has the record either:
	// refused on the lone server, through either path of the reservation
	// (the first look at a key, and a caller's after it saw the key).
	for i := range 2 {
		if _, err := g.Do(ctx, key, "fp", fn); !errors.Is(err, redis.ErrNotReplicated) || runs != 1 {
			t.Fatalf("replay %d, no replica, WaitReplicas 1: got %v, fn ran %d times; want ErrNotReplicated, fn run once", i+1, err, runs)
		}
	}
	// Without WaitReplicas the same server replays the applied completion.
	plain, err := redis.New(client, &redis.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	pg, err := idempotency.New(plain, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := pg.Do(ctx, key, "fp", fn)
	if err != nil || !resp.Replayed || string(resp.Body) != "done" || runs != 1 {
		t.Fatalf("retry on the same server without WaitReplicas: %+v, %v, fn ran %d times; want the applied completion replayed, fn run once", resp, err, runs)
	}
}
