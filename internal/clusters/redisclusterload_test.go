package clusters

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/redis"
)

// clusterService is a Guard on a private Redis Cluster whose prefix puts
// every key in one slot (the package doc's "app:{idem}:" form), with an
// effect counter per key in that slot.
type clusterService struct {
	client *goredis.ClusterClient
	guard  *idempotency.Guard[*redis.Tx]
	prefix string
	slot   int
}

func newClusterService(t *testing.T, c *RedisCluster) *clusterService {
	t.Helper()
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Addrs(), PoolSize: 16})
	t.Cleanup(func() { _ = client.Close() })
	prefix := "app:{idem-" + testkit.Name("") + "}:"
	g := redisGuard(t, client, &redis.Config{Prefix: prefix, Lease: 3 * time.Second}, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	slot, err := client.ClusterKeySlot(ctx, prefix).Result()
	if err != nil {
		t.Fatal(err)
	}
	return &clusterService{client: client, guard: g, prefix: prefix, slot: int(slot)}
}

func (s *clusterService) effectKey(id string) string { return s.prefix + "e:" + id }

func (s *clusterService) do(ctx context.Context, k idempotency.Key) (idempotency.Response, error) {
	return s.guard.Do(ctx, k, "fp", func(tx *redis.Tx) (idempotency.Response, error) {
		tx.Incr(ctx, s.effectKey(k.ID))
		return idempotency.Response{Status: 201, Body: fmt.Appendf(nil, `{"key":%q,"execution":%q}`, k.ID, rand.Text()[:12])}, nil
	})
}

// underLoad runs workers callers on new keys while change runs, then
// checks what the brief asks of a planned change: no call failed, every
// acknowledged answer is replayed byte-exact, one effect per key.
func (s *clusterService) underLoad(t *testing.T, workers int, change func(ctx context.Context)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	l := newLoad("cl")
	l.start(workers, func(k idempotency.Key) (idempotency.Response, error) { return s.do(ctx, k) }, func(int64) {})
	l.waitAcks(t, 100, 30*time.Second)
	start := time.Now()
	change(ctx)
	took := time.Since(start)
	if testing.Verbose() {
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		t0 := time.Now()
		_, err := s.do(dctx, idempotency.Key{Scope: "probe", ID: testkit.Name("p")})
		dcancel()
		t.Logf("probe after the change: %v in %v", err, time.Since(t0))
	}
	l.waitAcks(t, l.acks.Load()+100, 30*time.Second)
	calls := l.stop()
	var failed []string
	for _, c := range calls {
		if c.err != nil {
			failed = append(failed, c.err.Error())
		}
	}
	st := retryAll(t, calls, func(k idempotency.Key) (idempotency.Response, error) { return s.do(ctx, k) })
	wrong := 0
	for _, c := range calls {
		n, err := s.client.Get(ctx, s.effectKey(c.key.ID)).Int()
		if errors.Is(err, goredis.Nil) {
			n, err = 0, nil
		}
		if err != nil || n != 1 {
			wrong++
			if wrong <= 5 {
				t.Errorf("key %s: %d effects, %v; want 1", c.key.ID, n, err)
			}
		}
	}
	t.Logf("change took %v; %v; %d calls failed, %d keys without exactly one effect", took, st, len(failed), wrong)
	if len(failed) > 0 {
		t.Errorf("%d of %d calls failed during a planned change, e.g. %s", len(failed), len(calls), strings.Join(failed[:min(3, len(failed))], " | "))
	}
	if st.lostAcks > 0 {
		t.Errorf("%d acknowledged answers lost (the retry ran fn again)", st.lostAcks)
	}
}

// TestRedisClusterFailoverUnderLoad: a graceful CLUSTER FAILOVER, run on
// the replica of the master that serves the store's slot, while 8 callers
// run: no call fails, nothing acknowledged is lost, one effect per key.
func TestRedisClusterFailoverUnderLoad(t *testing.T) {
	c := StartRedisCluster(t, 3, 1)
	s := newClusterService(t, c)
	s.underLoad(t, 8, func(ctx context.Context) {
		owner, err := c.OwnerOf(ctx, s.slot)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range c.Masters {
			if m == owner {
				if err := c.Failover(ctx, c.Replicas[i]); err != nil {
					t.Fatal(err)
				}
				return
			}
		}
		t.Fatalf("slot %d owner %s is not an original master", s.slot, owner.Addr)
	})
}

// reshardRounds is how often TestRedisClusterReshardUnderLoad moves the slot.
const reshardRounds = 12

// TestRedisClusterReshardUnderLoad: the store's only slot is moved from
// master to master reshardRounds times (SETSLOT IMPORTING/MIGRATING, MIGRATE in
// batches of 10 keys, SETSLOT NODE: what redis-cli --cluster reshard does)
// while 8 callers run.
func TestRedisClusterReshardUnderLoad(t *testing.T) {
	c := StartRedisCluster(t, 3, 0)
	s := newClusterService(t, c)
	s.underLoad(t, 8, func(ctx context.Context) {
		for round := range reshardRounds {
			from, err := c.OwnerOf(ctx, s.slot)
			if err != nil {
				t.Fatal(err)
			}
			to := c.Masters[0]
			for _, m := range c.Masters {
				if m != from {
					to = m
					break
				}
			}
			if round%2 == 1 {
				to = c.Masters[2]
				if to == from {
					to = c.Masters[1]
				}
			}
			if err := c.BeginMigration(ctx, s.slot, from, to); err != nil {
				t.Fatal(err)
			}
			n, err := c.MoveKeys(ctx, s.slot, from, to, 10)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.EndMigration(ctx, s.slot, from, to); err != nil {
				t.Fatal(err)
			}
			// The store deletes no key of the slot (records are replaced in
			// place and expire no sooner than a lease): fewer keys on the
			// new owner than were moved means Redis dropped them.
			if have, err := c.Node(to.Addr).ClusterCountKeysInSlot(ctx, s.slot).Result(); err != nil || int(have) < n {
				t.Fatalf("round %d: %d keys moved to %s, which now has %d, %v", round, n, to.Addr, have, err)
			}
			if round < 2 || round == reshardRounds-1 {
				t.Logf("round %d: slot %d with %d keys moved from %s to %s", round, s.slot, n, from.Addr, to.Addr)
			}
		}
	})
}
