package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/clusters"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// startCluster starts a three-master Redis Cluster on free loopback ports
// (internal/clusters) and returns its addresses; the servers are killed by PID
// in t.Cleanup.
func startCluster(t *testing.T) []string {
	t.Helper()
	return clusters.StartRedisCluster(t, 3, 0).Addrs()
}

func TestCluster(t *testing.T) {
	addrs := startCluster(t)
	newClient := func(testing.TB) func(int) goredis.UniversalClient {
		return func(poolSize int) goredis.UniversalClient {
			return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, PoolSize: poolSize})
		}
	}

	// The fixture's prefixes carry a hash tag; check that keys without one
	// still spread over the nodes, so the suite below exercises routing.
	t.Run("KeysSpreadOverNodes", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		client := newClient(t)(0).(*goredis.ClusterClient)
		defer client.Close()
		s, err := New(client, &Config{Prefix: "spread:" + testkit.Name("p-") + ":"})
		if err != nil {
			t.Fatal(err)
		}
		nodes := map[string]bool{}
		for i := range 30 {
			c, err := client.MasterForKey(ctx, s.keysFor(keyN(i)).rec)
			if err != nil {
				t.Fatal(err)
			}
			nodes[c.Options().Addr] = true
		}
		if len(nodes) < 2 {
			t.Fatalf("30 keys landed on %d node(s), want several", len(nodes))
		}
	})

	t.Run("Conformance", func(t *testing.T) {
		conformance.Run(t, harness(newClient))
	})

	// Without a hash tag in the prefix, records of different keys live on
	// different nodes; effects named by Tx.Key stay in their record's slot.
	t.Run("UntaggedPrefix", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		client := newClient(t)(0)
		prefix := "untagged:" + testkit.Name("p-") + ":"
		t.Cleanup(func() { dropPrefix(t, client, prefix); _ = client.Close() })
		s, err := New(client, &Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 12 {
			k := keyN(i)
			r := reservation(k, "fp", time.Second)
			txn, _, err := s.Reserve(ctx, r)
			if err != nil || txn == nil {
				t.Fatalf("reserve %d: %v", i, err)
			}
			incr := txn.Tx().Incr(ctx, txn.Tx().Key("n"))
			if err := txn.Complete(ctx, resp201(i)); err != nil {
				t.Fatalf("complete %d: %v", i, err)
			}
			if incr.Val() != 1 {
				t.Fatalf("key %d: INCR queued on the Tx gave %d, %v; want 1", i, incr.Val(), incr.Err())
			}
			_, rec, err := s.Reserve(ctx, r)
			if err != nil || rec == nil || rec.Status != 201 || string(rec.Body) != fmt.Sprint(i) {
				t.Fatalf("replay %d: %+v, %v", i, rec, err)
			}
		}
	})

	// On Cluster the reservation is the plain script and Complete checks
	// the token under WATCH first: a new key costs three round trips, a
	// replay one (the script, which finds the record completed).
	t.Run("RoundTrips", func(t *testing.T) {
		ctx := testkit.Context(t, 30*time.Second)
		rt := &roundTrips{}
		_, g, fn := countedGuard(t, ctx, func(poolSize int) goredis.UniversalClient {
			c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, PoolSize: poolSize})
			// On the nodes' clients, which send every command, WATCH
			// included (the Cluster client's own hooks do not see those).
			c.OnNewNode(func(n *goredis.Client) { n.AddHook(rt) })
			return c
		})
		do := func(key idempotency.Key) func() error {
			return func() error { _, err := g.Do(ctx, key, "fp", fn); return err }
		}
		if err := do(idempotency.Key{ID: testkit.Name("warm-")})(); err != nil { // slots, pools, scripts
			t.Fatal(err)
		}
		key := idempotency.Key{ID: testkit.Name("rt-")}
		newKey, newKeyScripts := rt.measure(t, "Do, new key", do(key))
		replay, replayScripts := rt.measure(t, "Do, replay", do(key))
		if newKey != 3 || replay != 1 {
			t.Errorf("round trips on Cluster: new key %d, replay %d; want 3, 1", newKey, replay)
		}
		if newKeyScripts != 1 || replayScripts != 1 {
			t.Errorf("scripts on Cluster: new key %d, replay %d; want 1, 1", newKeyScripts, replayScripts)
		}
	})
}
