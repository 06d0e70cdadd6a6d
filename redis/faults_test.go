package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/redis"
)

// faultLease is the fault fixtures' lease: a holder that vanished behind a
// partition (nothing reaches Redis, not even its release) holds its key
// until the lease runs out. It is longer than the bound after an ordinary
// fault, so that a key held until its lease runs out fails that bound.
const faultLease = 4 * time.Second

// TestFaults runs the fault-injection suite (a cut connection, a lost
// reply, a partition and a slow step at every round trip of a call) on a
// warm and on a cold pool (see conformance.RunFaultsWarmAndCold), on a
// client with ContextTimeoutEnabled: without it go-redis ignores the
// caller's context deadline on the socket, and a lost reply holds Do for
// ReadTimeout (3s by default) whatever the deadline.
func TestFaults(t *testing.T) {
	upstream := testenv.RedisAddr(t)
	conformance.RunFaultsWarmAndCold(t, conformance.FaultHarness[*redis.Tx]{
		Upstream: upstream,
		NewFixture: func(t testing.TB, addr, ns string) conformance.Fixture[*redis.Tx] {
			return faultFixture(t, addr, ns, addr == upstream)
		},
		CallTimeout:    time.Second,
		Bound:          3 * time.Second,
		PartitionBound: faultLease + 1500*time.Millisecond,
	})
}

// faultFixture is a store under the prefix faults:<ns>: whose effects are
// increments of a counter per tag in the hash faults:<ns>:fx, queued on
// the Tx, on a client that dials addr. The fixture on the server itself
// (owner) deletes the counters at cleanup.
func faultFixture(t testing.TB, addr, ns string, owner bool) conformance.Fixture[*redis.Tx] {
	t.Helper()
	client := goredis.NewClient(&goredis.Options{Addr: addr, DialTimeout: 2 * time.Second, PoolSize: 4, ContextTimeoutEnabled: true})
	prefix := "faults:" + ns + ":"
	effects := prefix + "fx"
	store, err := redis.New(client, &redis.Config{Prefix: prefix, Lease: faultLease})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if owner {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = client.Del(ctx, effects).Err()
		}
		_ = client.Close()
	})
	return conformance.Fixture[*redis.Tx]{
		Store: store,
		Effect: func(ctx context.Context, tx *redis.Tx, tag string) error {
			return tx.HIncrBy(ctx, effects, tag, 1).Err()
		},
		Count: func(ctx context.Context, tag string) (int, error) {
			n, err := client.HGet(ctx, effects, tag).Int()
			if errors.Is(err, goredis.Nil) {
				return 0, nil
			}
			return n, err
		},
	}
}
