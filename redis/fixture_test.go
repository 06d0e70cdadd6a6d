package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// newPrefix returns a fresh prefix with a hash tag, so that the effect
// counters of a fixture live in the slot of its records on Cluster too.
func newPrefix() string { return "idemtest:{" + testkit.Name("p-") + "}:" }

// dropPrefix deletes every key under prefix, on every master.
func dropPrefix(t testing.TB, client goredis.UniversalClient, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a million keys after BenchmarkScale
	defer cancel()
	drop := func(ctx context.Context, c goredis.UniversalClient) error {
		var cursor uint64
		for {
			ks, next, err := c.Scan(ctx, cursor, prefix+"*", 10000).Result()
			if err != nil {
				return err
			}
			if len(ks) > 0 {
				if _, err := c.Pipelined(ctx, func(p goredis.Pipeliner) error {
					for _, k := range ks {
						p.Unlink(ctx, k)
					}
					return nil
				}); err != nil {
					return err
				}
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	var err error
	if cc, ok := client.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return drop(ctx, c) })
	} else {
		err = drop(ctx, client)
	}
	if err != nil {
		t.Errorf("cleanup of %s: %v", prefix, err)
	}
}

// fixture is a store on a fresh client and prefix, with an effect counter
// queued on the transaction pipeline.
type fixture struct {
	client goredis.UniversalClient
	store  *Store
	prefix string
}

func (f *fixture) effectKey(tag string) string { return f.prefix + "effects:" + tag }

func (f *fixture) effect(ctx context.Context, tx *Tx, tag string) error {
	tx.Incr(ctx, f.effectKey(tag))
	return nil
}

// bare performs the effect of [fixture.effect] in a plain MULTI/EXEC on the
// same client, with no idempotency: the benchmarks' baseline.
func (f *fixture) bare(ctx context.Context, tag string) error {
	_, err := f.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.Incr(ctx, f.effectKey(tag))
		return nil
	})
	return err
}

// fill writes n completed records (scope "fill", ids 0 to n-1) expiring at
// expiresAt, in pipelined batches.
func (f *fixture) fill(ctx context.Context, n int, expiresAt time.Time) error {
	if !expiresAt.After(time.Now()) {
		return fmt.Errorf("redis: cannot store records expired at %v: Redis deletes them at once", expiresAt)
	}
	const batch = 10000
	created := strconv.FormatInt(time.Now().UnixMilli(), 10)
	expires := strconv.FormatInt(expiresAt.UnixMilli(), 10)
	for i := 0; i < n; i += batch {
		if _, err := f.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for j := i; j < min(i+batch, n); j++ {
				key := idempotency.Key{Scope: "fill", ID: strconv.Itoa(j)}
				rec := f.store.keysFor(key).rec
				p.HSet(ctx, rec, "state", stateCompleted, "scope", key.Scope, "id", key.ID, "fp", "fp",
					"status", "201", "hdr", "{}", "body", "filled", "created", created, "expires", expires)
				p.PExpireAt(ctx, rec, expiresAt)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

func (f *fixture) count(ctx context.Context, tag string) (int, error) {
	n, err := f.client.Get(ctx, f.effectKey(tag)).Int()
	if errors.Is(err, goredis.Nil) {
		return 0, nil
	}
	return n, err
}

// newFixture builds a fixture on a client from newClient (poolSize 0 means
// the go-redis default).
func newFixture(t testing.TB, newClient func(poolSize int) goredis.UniversalClient, poolSize int, cfg *Config) *fixture {
	t.Helper()
	client := newClient(poolSize)
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c.Prefix = newPrefix()
	store, err := New(client, &c)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{client: client, store: store, prefix: c.Prefix}
	t.Cleanup(func() {
		dropPrefix(t, client, c.Prefix)
		_ = client.Close()
	})
	return f
}

func singleClient(t testing.TB) func(int) goredis.UniversalClient {
	addr := testenv.RedisAddr(t)
	return func(poolSize int) goredis.UniversalClient {
		return goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: poolSize})
	}
}

func reservation(key idempotency.Key, fp string, wait time.Duration) backend.Reservation {
	return backend.Reservation{Key: key, Fingerprint: fp, TTL: time.Hour, Wait: wait}
}

// crash simulates the death of a reservation's holder: it stops renewing
// and never completes nor rolls back.
func crash(t *testing.T, held backend.Txn[*Tx]) {
	t.Helper()
	held.(*txn).stop()
}

func keyN(i int) idempotency.Key { return idempotency.Key{Scope: "n", ID: "key-" + strconv.Itoa(i)} }

func resp201(i int) idempotency.Response {
	return idempotency.Response{Status: 201, Body: []byte(strconv.Itoa(i))}
}

// hooked returns a fixture's client constructor: a client of addr with h
// added, whatever pool size the fixture asks for.
func hooked(addr string, h goredis.Hook) func(int) goredis.UniversalClient {
	return func(int) goredis.UniversalClient {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		c.AddHook(h)
		return c
	}
}
