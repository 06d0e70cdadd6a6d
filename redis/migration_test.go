package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/clusters"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// migrationRig is a private three-master Cluster, a Cluster client, a
// Store whose prefix puts every key in one slot (the package doc's
// "app:{idem}:" form) and a Guard on it.
type migrationRig struct {
	c      *clusters.RedisCluster
	client *goredis.ClusterClient
	store  *Store
	guard  *idempotency.Guard[*Tx]
	slot   int
}

func newMigrationRig(t *testing.T, lease time.Duration, masters, replicas int) *migrationRig {
	t.Helper()
	testenv.RedisAddr(t) // Redis is required (or skipped) as for the other tests
	c := clusters.StartRedisCluster(t, masters, replicas)
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Addrs(), ReadTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = client.Close() })
	prefix := "app:{idem-" + testkit.Name("") + "}:"
	s, err := New(client, &Config{Prefix: prefix, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.New(s, &idempotency.Config{WaitTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testkit.Context(t, 10*time.Second)
	slot, err := client.ClusterKeySlot(ctx, prefix).Result()
	if err != nil {
		t.Fatal(err)
	}
	return &migrationRig{c: c, client: client, store: s, guard: g, slot: int(slot)}
}

// effect queues the effect of key k on tx: HINCRBY of a hash in the
// record's slot.
func (m *migrationRig) effect(ctx context.Context, tx *Tx) {
	tx.HIncrBy(ctx, tx.Key("effects"), "n", 1)
}

// effects reads the effect count of k on node (or through the Cluster
// client if node is nil).
func (m *migrationRig) effects(ctx context.Context, k idempotency.Key, node *clusters.RedisNode) (int, error) {
	key := m.store.keysFor(k).base + "u:effects"
	var n int
	var err error
	if node == nil {
		n, err = m.client.HGet(ctx, key, "n").Int()
	} else {
		var get *goredis.StringCmd
		_, err = m.c.Node(node.Addr).Pipelined(ctx, func(p goredis.Pipeliner) error {
			p.Do(ctx, "asking") // the node may be importing the slot
			get = p.HGet(ctx, key, "n")
			return nil
		})
		if err == nil || errors.Is(err, goredis.Nil) {
			n, err = get.Int()
		}
	}
	if errors.Is(err, goredis.Nil) {
		return 0, nil
	}
	return n, err
}

// nodes returns the slot's owner and another master.
func (m *migrationRig) nodes(t *testing.T, ctx context.Context) (from, to *clusters.RedisNode) {
	t.Helper()
	from, err := m.c.OwnerOf(ctx, m.slot)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range m.c.Masters {
		if n != from {
			return from, n
		}
	}
	t.Fatal("no other master")
	return nil, nil
}

// do runs one call of key k whose fn queues the effect and answers body.
func (m *migrationRig) do(ctx context.Context, k idempotency.Key, body string, inFn func()) (idempotency.Response, error) {
	return m.guard.Do(ctx, k, "fp", func(tx *Tx) (idempotency.Response, error) {
		m.effect(ctx, tx)
		if inFn != nil {
			inFn()
		}
		return idempotency.Response{Status: 201, Body: []byte(body)}, nil
	})
}

// TestSlotMigrationWhileHeld: the key's slot goes MIGRATING and its
// pending record moves to the target while fn runs (as redis-cli --cluster
// reshard does); fn returns before the hand-over. Do must answer only if
// the answer and the effect are stored where the record now lives; after
// the hand-over, the replay is byte-exact and the effect counted once.
func TestSlotMigrationWhileHeld(t *testing.T) {
	m := newMigrationRig(t, 3*time.Second, 3, 0)
	ctx := testkit.Context(t, 60*time.Second)
	from, to := m.nodes(t, ctx)
	k := idempotency.Key{Scope: "mig", ID: testkit.Name("held-")}
	body := "answer-" + testkit.Name("")

	inFn, release := make(chan struct{}), make(chan struct{})
	var resp idempotency.Response
	var doErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		resp, doErr = m.do(ctx, k, body, func() { close(inFn); <-release })
	}()
	<-inFn
	if err := m.c.BeginMigration(ctx, m.slot, from, to); err != nil {
		t.Fatal(err)
	}
	n, err := m.c.MoveKeys(ctx, m.slot, from, to, 100)
	if err != nil || n == 0 {
		t.Fatalf("moved %d keys: %v", n, err)
	}
	close(release)
	// The hand-over comes while Complete waits for it (its EXEC names the
	// record and the effect, and the slot's keys are split until then):
	// the moment redis-cli --cluster reshard ends a slot.
	time.Sleep(300 * time.Millisecond)
	if err := m.c.EndMigration(ctx, m.slot, from, to); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	var all *goredis.MapStringStringCmd
	_, err = m.c.Node(to.Addr).Pipelined(ctx, func(p goredis.Pipeliner) error {
		all = p.HGetAll(ctx, m.store.keysFor(k).rec)
		return nil
	})
	rec := all.Val()
	if err != nil {
		t.Fatal(err)
	}
	effects, err := m.effects(ctx, k, to)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Do: %v; on the new owner: record state %q body %q, effects %d", doErr, rec["state"], rec["body"], effects)
	if doErr == nil && (rec["state"] != stateCompleted || rec["body"] != body || effects != 1) {
		t.Fatalf("Do answered, but the slot's owner holds state %q body %q and %d effects: an acknowledged answer not stored", rec["state"], rec["body"], effects)
	}
	if doErr != nil {
		t.Fatalf("Do while the slot migrates: %v; want the answer (a retry within the bound would have given it)", doErr)
	}
	if string(resp.Body) != body || resp.Replayed {
		t.Fatalf("Do answered %+v, want %q executed", resp, body)
	}

	again, err := m.guard.Do(ctx, k, "fp", func(tx *Tx) (idempotency.Response, error) {
		m.effect(ctx, tx)
		return idempotency.Response{Status: 201, Body: []byte("second run")}, nil
	})
	if err != nil || !again.Replayed || string(again.Body) != body || again.Status != 201 {
		t.Fatalf("replay after the hand-over: %+v, %v; want %q replayed", again, err, body)
	}
	if n, err := m.effects(ctx, k, nil); err != nil || n != 1 {
		t.Fatalf("effects after the replay: %d, %v; want 1", n, err)
	}
}

// TestSlotMidMigration: with the slot MIGRATING and half of its keys on
// the target, replays of completed keys (on either node) and new keys are
// answered, not failed with TRYAGAIN (ErrStore+ErrConflict).
func TestSlotMidMigration(t *testing.T) {
	m := newMigrationRig(t, 3*time.Second, 3, 0)
	ctx := testkit.Context(t, 60*time.Second)
	from, to := m.nodes(t, ctx)
	const completed = 10
	keyOf := func(i int) idempotency.Key { return idempotency.Key{Scope: "mid", ID: "k" + strconv.Itoa(i)} }
	for i := range completed {
		if _, err := m.do(ctx, keyOf(i), "body-"+strconv.Itoa(i), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.c.BeginMigration(ctx, m.slot, from, to); err != nil {
		t.Fatal(err)
	}
	// Move the records of the even keys only.
	host, port := to.Addr[:len("127.0.0.1")], to.Addr[len("127.0.0.1:"):]
	for i := 0; i < completed; i += 2 {
		base := m.store.keysFor(keyOf(i)).base
		if err := m.c.Node(from.Addr).Do(ctx, "migrate", host, port, "", 0, 5000, "keys", base+"rec", base+"u:effects").Err(); err != nil {
			t.Fatalf("MIGRATE key %d: %v", i, err)
		}
	}
	start := time.Now()
	var failed []string
	for i := range completed {
		resp, err := m.do(ctx, keyOf(i), "again", nil)
		if err != nil || !resp.Replayed || string(resp.Body) != "body-"+strconv.Itoa(i) {
			failed = append(failed, fmt.Sprintf("replay %d: %+v, %v", i, resp, err))
		}
	}
	t.Logf("%d replays mid-migration in %v", completed, time.Since(start))
	// New keys: reserved on the importing node (ASK), and completed once
	// the slot is handed over (until then their EXEC names a record there
	// and an effect key that is nowhere: TRYAGAIN). The hand-over comes
	// while they wait, as at the end of a slot's reshard.
	const fresh = 5
	errs := make([]error, fresh)
	resps := make([]idempotency.Response, fresh)
	var wg sync.WaitGroup
	for j := range fresh {
		wg.Add(1)
		go func() {
			defer wg.Done()
			i := completed + j
			resps[j], errs[j] = m.do(ctx, keyOf(i), "new-"+strconv.Itoa(i), nil)
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := m.c.MoveKeys(ctx, m.slot, from, to, 100); err != nil {
		t.Fatal(err)
	}
	if err := m.c.EndMigration(ctx, m.slot, from, to); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for j := range fresh {
		i := completed + j
		if errs[j] != nil || resps[j].Replayed || string(resps[j].Body) != "new-"+strconv.Itoa(i) {
			failed = append(failed, fmt.Sprintf("new key %d: %+v, %v", i, resps[j], errs[j]))
		}
	}
	t.Logf("%d replays and %d new keys across the migration in %v", completed, fresh, time.Since(start))
	if len(failed) > 0 {
		t.Fatalf("%d of %d calls failed:\n%v", len(failed), completed+fresh, failed)
	}
	for i := range completed + 5 {
		if n, err := m.effects(ctx, keyOf(i), nil); err != nil || n != 1 {
			t.Errorf("key %d: %d effects, %v; want 1", i, n, err)
		}
	}
}
