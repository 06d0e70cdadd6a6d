package clusters_test

import (
	"context"
	"database/sql"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/mysql"
	"github.com/go-idempotency/idempotency/redis"
)

// Example_redisWaitReplicas answers a Redis completion only once a replica
// has it (TestRedisFailover: 0 acknowledged completions lost). Compiled,
// not run: it needs a Sentinel named "payments".
func Example_redisWaitReplicas() {
	client := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName:    "payments",
		SentinelAddrs: []string{"sentinel-1:26379", "sentinel-2:26379", "sentinel-3:26379"},
	})
	defer client.Close()
	// readme:begin scale-redis-wait
	store, err := redis.New(client, &redis.Config{
		WaitReplicas:   1,                      // answer only once a replica acknowledged the completion
		ReplicaTimeout: 200 * time.Millisecond, // otherwise Do fails with redis.ErrNotReplicated
	})
	// readme:end scale-redis-wait
	if err != nil {
		return
	}
	_, _ = idempotency.New(store, nil)
}

// Example_galeraStreaming opens the mysql store on a Galera cluster with
// streaming replication on the store's sessions (TestGalera: the whole
// conformance suite passes with callers spread over three nodes).
// Compiled, not run: it needs a cluster.
func Example_galeraStreaming() {
	ctx := context.Background()
	// readme:begin scale-galera-dsn
	// One statement per fragment: the key's row is replicated and locked on
	// every node before fn runs, so callers on other nodes wait for it.
	db, err := mysql.Open(ctx, "app@tcp(galera-node-1:3306)/app?interpolateParams=true"+
		"&wsrep_trx_fragment_unit=%27statements%27&wsrep_trx_fragment_size=1")
	// readme:end scale-galera-dsn
	if err != nil {
		return
	}
	defer db.Close()
	store, err := mysql.New(db, nil)
	if err != nil {
		return
	}
	_ = store.Migrate(ctx)
	guard, _ := idempotency.New(store, nil)
	_, _ = guard.Do(ctx, idempotency.Key{ID: "k"}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 204}, nil
	})
}
