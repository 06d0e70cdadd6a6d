package clusters

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/redis"
)

// redisService is one service instance on the Redis set, through the
// Sentinel: a client that follows the primary, a Store and a Guard.
type redisService struct {
	client *goredis.Client
	guard  *idempotency.Guard[*redis.Tx]
}

const redisPrefix = "ha:{pay}:"

func newRedisService(t testing.TB, set *RedisSet, cfg redis.Config) *redisService {
	t.Helper()
	client := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName:    SentinelMaster,
		SentinelAddrs: []string{set.SentinelAddr()},
		PoolSize:      16,
		DialTimeout:   time.Second,
		ReadTimeout:   3 * time.Second,
		WriteTimeout:  time.Second,
		MaxRetries:    1,
	})
	t.Cleanup(func() { _ = client.Close() })
	cfg.Prefix = redisPrefix
	// A reservation in flight when the primary dies reached the replica
	// and holds its key there until its lease runs out: a short lease, and
	// callers that wait longer than it, let the retries take those keys.
	cfg.Lease = 2 * time.Second
	return &redisService{client: client, guard: redisGuard(t, client, &cfg, 10*time.Second)}
}

// redisGuard returns a Guard on a Redis store of client, configured by cfg,
// whose callers wait up to wait for a key held by another; it fails t if
// either cannot be built.
func redisGuard(t testing.TB, client goredis.UniversalClient, cfg *redis.Config, wait time.Duration) *idempotency.Guard[*redis.Tx] {
	t.Helper()
	store, err := redis.New(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.New(store, &idempotency.Config{WaitTimeout: wait})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// redisEffects is a hash of effect counters, one field per key (a single
// primary: no Cluster slot to share with the records).
const redisEffects = redisPrefix + "effects"

// do runs one call whose effect lives in Redis: an increment of the key's
// counter, queued on the Tx, applied in the completion's MULTI/EXEC.
func (s *redisService) do(ctx context.Context, key idempotency.Key) (idempotency.Response, error) {
	return s.guard.Do(ctx, key, "fp", func(tx *redis.Tx) (idempotency.Response, error) {
		tx.HIncrBy(ctx, redisEffects, key.ID, 1)
		return idempotency.Response{Status: 201, Body: fmt.Appendf(nil, `{"key":%q,"execution":%q}`, key.ID, rand.Text()[:12])}, nil
	})
}

// TestRedisFailover runs calls on a Redis primary, kills it (SIGKILL, the
// replication link cut) right after acknowledged completions, lets the
// Sentinel promote the replica and retries every call with the same key
// through the Sentinel. Natural: the kill lands while 8 callers run at full
// speed. Lagging: the replication link is stalled first. WaitReplicas=1:
// a completion is answered only once the replica acknowledged it (WAIT).
func TestRedisFailover(t *testing.T) {
	for _, c := range []struct {
		name         string
		waitReplicas int
		lag          bool
	}{
		{"NoWait/Natural", 0, false},
		{"NoWait/LaggingReplica", 0, true},
		{"WaitReplicas1/Natural", 1, false},
		{"WaitReplicas1/LaggingReplica", 1, true},
	} {
		t.Run(c.name, func(t *testing.T) { redisFailover(t, c.waitReplicas, c.lag) })
	}
}

func redisFailover(t *testing.T, waitReplicas int, lag bool) {
	const workers, killAfter, stall = 8, 300, 500 * time.Millisecond
	set := StartRedis(t)
	cfg := redis.Config{WaitReplicas: waitReplicas, ReplicaTimeout: 100 * time.Millisecond}
	primary := newRedisService(t, set, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	l := newLoad("redis")
	var kill sync.Once
	killNow := func() { kill.Do(set.KillPrimary) }
	var notReplicated atomic.Int64
	l.start(workers, func(k idempotency.Key) (idempotency.Response, error) {
		resp, err := primary.do(ctx, k)
		if errors.Is(err, redis.ErrNotReplicated) {
			notReplicated.Add(1)
		}
		return resp, err
	}, func(n int64) {
		if !lag && n == killAfter {
			killNow() // right after this acknowledged completion, others in flight
		}
	})
	l.waitAcks(t, killAfter, 60*time.Second)
	if lag {
		l.stalled.Store(true)
		set.Link.Partition(0)
		time.Sleep(stall)
		killNow()
	}
	calls := l.stop()
	set.AwaitFailover()

	// The promoted replica has no replica of its own: the retries run
	// without WAIT (with it, every completion would be refused; checked
	// at the end).
	replica := newRedisService(t, set, redis.Config{})
	s := retryAll(t, calls, func(k idempotency.Key) (idempotency.Response, error) { return replica.do(ctx, k) })
	t.Logf("WaitReplicas=%d lag=%v: %v; %d calls refused with ErrNotReplicated", waitReplicas, lag, s, notReplicated.Load())

	// The effect and the completion are one MULTI/EXEC: every key has
	// exactly one effect on the promoted replica.
	effects, err := replica.client.HGetAll(ctx, redisEffects).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		if n := effects[c.key.ID]; n != "1" {
			t.Fatalf("key %s: %q effects on the promoted replica, want 1", c.key.ID, n)
		}
	}
	if len(effects) != len(calls) {
		t.Fatalf("%d keys have effects, want %d", len(effects), len(calls))
	}

	if waitReplicas > 0 {
		// The price of WAIT: with no replica left, nothing is answered.
		lone := newRedisService(t, set, cfg)
		_, err := lone.do(ctx, idempotency.Key{Scope: "ha", ID: "lone-" + rand.Text()[:8]})
		if !errors.Is(err, redis.ErrNotReplicated) {
			t.Fatalf("WaitReplicas=%d on a primary without replicas: got %v, want ErrNotReplicated", waitReplicas, err)
		}
	}

	switch {
	case waitReplicas > 0:
		if s.lostAcks != 0 {
			t.Fatalf("WaitReplicas=%d: %d acknowledged completions lost in the failover, want 0", waitReplicas, s.lostAcks)
		}
		if lag && (s.ackedAfterStall != 0 || notReplicated.Load() == 0) {
			t.Fatalf("WaitReplicas=%d, stalled replica: %d calls started after the stall were answered (want 0), %d refused with ErrNotReplicated (want > 0)",
				waitReplicas, s.ackedAfterStall, notReplicated.Load())
		}
	case lag:
		if s.ackedAfterStall == 0 || s.lostAfterStall != s.ackedAfterStall {
			t.Fatalf("no WAIT, stalled replica: %d of %d acknowledged completions started after the stall were lost; want all of them, and more than 0",
				s.lostAfterStall, s.ackedAfterStall)
		}
	}
}
