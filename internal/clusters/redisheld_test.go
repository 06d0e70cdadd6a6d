package clusters

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/redis"
)

// heldRun is the outcome of holding keys through a planned failover: the
// holders' and the second callers' answers, and how often each key's fn ran.
type heldRun struct {
	keys     []idempotency.Key
	runs     []atomic.Int32
	holders  []idempotency.Response
	holdErrs []error
	seconds  []idempotency.Response
	secErrs  []error
}

// holdThrough holds n keys (fn queues an HINCRBY of effects and blocks)
// on guard, runs failover while they are held, then waits past the lease,
// starts a second caller per key, lets the holders finish, and collects
// every answer. No second caller may run fn while its holder lives.
func holdThrough(t *testing.T, ctx context.Context, guard *idempotency.Guard[*redis.Tx], effects func(id string) string,
	n int, lease time.Duration, failover func()) *heldRun {
	t.Helper()
	r := &heldRun{runs: make([]atomic.Int32, n), holders: make([]idempotency.Response, n), holdErrs: make([]error, n),
		seconds: make([]idempotency.Response, n), secErrs: make([]error, n)}
	for i := range n {
		r.keys = append(r.keys, idempotency.Key{Scope: "held", ID: fmt.Sprintf("%s-%d", testkit.Name("k"), i)})
	}
	call := func(i int, block <-chan struct{}, started chan<- struct{}) (idempotency.Response, error) {
		k := r.keys[i]
		return guard.Do(ctx, k, "fp", func(tx *redis.Tx) (idempotency.Response, error) {
			r.runs[i].Add(1)
			tx.HIncrBy(ctx, effects(k.ID), k.ID, 1)
			if started != nil {
				started <- struct{}{}
			}
			if block != nil {
				<-block
			}
			return idempotency.Response{Status: 201, Body: []byte("run-" + strconv.Itoa(int(r.runs[i].Load())) + "-" + k.ID)}, nil
		})
	}
	release := make(chan struct{})
	started := make(chan struct{}, n)
	var holders, seconds sync.WaitGroup
	for i := range n {
		holders.Add(1)
		go func() { defer holders.Done(); r.holders[i], r.holdErrs[i] = call(i, release, started) }()
	}
	for range n {
		<-started
	}
	failover()
	time.Sleep(lease + lease/2) // a lease not renewed on the new primary has run out
	for i := range n {
		seconds.Add(1)
		go func() { defer seconds.Done(); r.seconds[i], r.secErrs[i] = call(i, nil, nil) }()
	}
	time.Sleep(300 * time.Millisecond) // the second callers wait (or, wrongly, run fn)
	close(release)
	holders.Wait()
	seconds.Wait()
	return r
}

// check fails t unless every key ran fn once, every call was answered, the
// second callers replayed their holder's bytes, and effects are 1 a key.
func (r *heldRun) check(t *testing.T, ctx context.Context, count func(ctx context.Context, k idempotency.Key) (int, error)) {
	t.Helper()
	bad := 0
	for i, k := range r.keys {
		n, err := count(ctx, k)
		if runs := r.runs[i].Load(); runs != 1 || r.holdErrs[i] != nil || r.secErrs[i] != nil ||
			!r.seconds[i].Replayed || string(r.seconds[i].Body) != string(r.holders[i].Body) || err != nil || n != 1 {
			bad++
			t.Errorf("key %s: fn ran %d times; holder %q, %v; second caller %q (replayed %v), %v; effects %d, %v",
				k.ID, runs, r.holders[i].Body, r.holdErrs[i], r.seconds[i].Body, r.seconds[i].Replayed, r.secErrs[i], n, err)
		}
	}
	t.Logf("%d of %d held keys came through with one run, no error and a byte-exact replay", len(r.keys)-bad, len(r.keys))
}

// TestRedisSentinelFailoverWhileHeld: a graceful SENTINEL FAILOVER while
// keys are held (the holders' reservations pinned to the old primary's
// connections). The renewals must follow the primary: no second caller
// runs fn once the lease has passed, the holders complete without error,
// and the second callers replay their answers.
func TestRedisSentinelFailoverWhileHeld(t *testing.T) {
	set := StartRedis(t)
	const lease = 3 * time.Second
	client := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName: SentinelMaster, SentinelAddrs: []string{set.SentinelAddr()},
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
	t.Cleanup(func() { _ = client.Close() })
	guard := redisGuard(t, client, &redis.Config{Prefix: "held:", Lease: lease}, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const effects = "held:effects"
	start := time.Now()
	r := holdThrough(t, ctx, guard, func(string) string { return effects }, 4, lease, set.Failover)
	t.Logf("failover and hold in %v", time.Since(start))
	r.check(t, ctx, func(ctx context.Context, k idempotency.Key) (int, error) {
		return client.HGet(ctx, effects, k.ID).Int()
	})
}

// TestRedisSentinelFailoverUnderLoad: a SENTINEL FAILOVER while 8 callers
// run on new keys. The Sentinel promotes the replica and only then turns
// the old primary into a replica; what the old primary acknowledged in
// between is lost with it (a failover the Sentinel asked for is no more
// coordinated than one after a crash). Without WAIT that is measured and
// logged; with WaitReplicas 1 nothing acknowledged may be lost. One effect
// per key either way.
func TestRedisSentinelFailoverUnderLoad(t *testing.T) {
	for _, w := range []int{0, 1} {
		t.Run(fmt.Sprintf("WaitReplicas%d", w), func(t *testing.T) { sentinelFailoverUnderLoad(t, w) })
	}
}

func sentinelFailoverUnderLoad(t *testing.T, waitReplicas int) {
	set := StartRedis(t)
	svc := newRedisService(t, set, redis.Config{WaitReplicas: waitReplicas, ReplicaTimeout: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	l := newLoad("sf")
	l.start(8, func(k idempotency.Key) (idempotency.Response, error) { return svc.do(ctx, k) }, func(int64) {})
	l.waitAcks(t, 200, 30*time.Second)
	set.Failover()
	l.stalled.Store(true) // calls marked "after the stall" started once the Sentinel named the new primary
	// With WAIT, answers resume only once the client writes to the new
	// primary (in the runs measured, 10-20 s after the failover).
	l.waitAcks(t, l.acks.Load()+50, 60*time.Second)
	calls := l.stop()
	failed, notReplicated := 0, 0
	for _, c := range calls {
		if c.err != nil {
			failed++
			if errors.Is(c.err, redis.ErrNotReplicated) {
				notReplicated++
			}
		}
	}
	// The retries run without WAIT (the promoted replica has no replica
	// until the old primary has resynchronised), each up to 3 times: the
	// client may still hold connections the failover closed.
	retrier := newRedisService(t, set, redis.Config{})
	st := retryAll(t, calls, func(k idempotency.Key) (idempotency.Response, error) {
		var err error
		for range 3 {
			var resp idempotency.Response
			if resp, err = retrier.do(ctx, k); err == nil {
				return resp, nil
			}
			time.Sleep(100 * time.Millisecond)
		}
		return idempotency.Response{}, err
	})
	effects, err := retrier.client.HGetAll(ctx, redisEffects).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		if n := effects[c.key.ID]; n != "1" {
			t.Errorf("key %s: %q effects, want 1", c.key.ID, n)
		}
	}
	t.Logf("WaitReplicas=%d (\"after the stall\": started once the Sentinel named the new primary): %v; %d calls failed during the failover, %d of them with ErrNotReplicated",
		waitReplicas, st, failed, notReplicated)
	if waitReplicas > 0 && st.lostAcks > 0 {
		t.Errorf("WaitReplicas=%d: %d acknowledged answers lost in the failover, want 0", waitReplicas, st.lostAcks)
	}
}
