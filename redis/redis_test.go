package redis

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testenv"
)

func uniq(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%x", prefix, b)
}

// newPrefix returns a fresh prefix with a hash tag, so that the effect
// counters of a fixture live in the slot of its records on Cluster too.
func newPrefix() string { return "idemtest:{" + uniq("p") + "}:" }

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

func harness(newClient func(t testing.TB) func(int) goredis.UniversalClient) conformance.Harness[*Tx] {
	return conformance.Harness[*Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*Tx] {
			f := newFixture(t, newClient(t), opts.MaxConns, nil)
			return conformance.Fixture[*Tx]{Store: f.store, Effect: f.effect, Count: f.count, Bare: f.bare, Fill: f.fill}
		},
		// Completed records expire by themselves; Purge returns 0.
		Features: conformance.Features{SelfExpiring: true},
	}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, harness(singleClient))
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func reservation(key idempotency.Key, fp string, wait time.Duration) idempotency.Reservation {
	now := time.Now()
	return idempotency.Reservation{Key: key, Fingerprint: fp, Now: now, ExpiresAt: now.Add(time.Hour), Wait: wait}
}

// crash simulates the death of a reservation's holder: it stops renewing
// and never completes nor rolls back.
func crash(t *testing.T, held idempotency.Txn[*Tx]) {
	t.Helper()
	held.(*txn).stop()
}

// TestLeaseTakeoverDuplicatesExternalEffect shows the documented limit: a
// holder that dies after an effect outside Redis leaves the key to a retry
// once its lease expires, and the effect runs twice. The same crash with
// the effect queued on the pipeline leaves one effect.
func TestLeaseTakeoverDuplicatesExternalEffect(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	const lease = 200 * time.Millisecond
	f := newFixture(t, singleClient(t), 0, &Config{Lease: lease})
	g, err := idempotency.New(f.store, &idempotency.Config{WaitTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("ExternalEffect", func(t *testing.T) {
		key := idempotency.Key{ID: uniq("ext")}
		var external atomic.Int64 // stands for a charge in another store
		a, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
		if err != nil || a == nil {
			t.Fatalf("A reserves: %v, %v", a, err)
		}
		external.Add(1) // A's effect, outside Redis
		crash(t, a)     // A dies before Complete
		start := time.Now()
		resp, err := g.Do(ctx, key, "fp", func(tx *Tx) (idempotency.Response, error) {
			external.Add(1)
			return idempotency.Response{Status: http.StatusCreated, Body: []byte("B")}, nil
		})
		if err != nil || resp.Replayed {
			t.Fatalf("B after A's lease expired: got %+v, %v; want executed", resp, err)
		}
		if got := external.Load(); got != 2 {
			t.Fatalf("external effects: got %d, want 2 (the documented duplicate)", got)
		}
		t.Logf("B took the key over %v after A died (lease %v); the external effect ran twice, as documented", time.Since(start), lease)
	})

	t.Run("PipelineEffect", func(t *testing.T) {
		key := idempotency.Key{ID: uniq("pipe")}
		a, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
		if err != nil || a == nil {
			t.Fatalf("A reserves: %v, %v", a, err)
		}
		if err := f.effect(ctx, a.Tx(), "pipe"); err != nil {
			t.Fatal(err)
		}
		crash(t, a)
		resp, err := g.Do(ctx, key, "fp", func(tx *Tx) (idempotency.Response, error) {
			if err := f.effect(ctx, tx, "pipe"); err != nil {
				return idempotency.Response{}, err
			}
			return idempotency.Response{Status: http.StatusCreated, Body: []byte("B")}, nil
		})
		if err != nil || resp.Replayed {
			t.Fatalf("B after A's lease expired: got %+v, %v; want executed", resp, err)
		}
		if n, err := f.count(ctx, "pipe"); err != nil || n != 1 {
			t.Fatalf("pipeline effects: got %d, %v; want 1", n, err)
		}
	})
}

// TestStaleOwnerCompleteRefused: a holder whose lease expired and was taken
// over cannot complete; nothing it queued is applied and the new holder's
// record stands.
func TestStaleOwnerCompleteRefused(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	f := newFixture(t, singleClient(t), 0, &Config{Lease: 150 * time.Millisecond})
	key := idempotency.Key{Scope: "s", ID: uniq("stale")}

	a, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
	if err != nil || a == nil {
		t.Fatalf("A reserves: %v, %v", a, err)
	}
	_ = f.effect(ctx, a.Tx(), "stale")
	crash(t, a) // A stalls (a long GC pause, a partition) and stops renewing

	b, _, err := f.store.Reserve(ctx, reservation(key, "fp", 10*time.Second))
	if err != nil || b == nil {
		t.Fatalf("B reserves after A's lease: %v, %v", b, err)
	}
	_ = f.effect(ctx, b.Tx(), "stale")

	// A wakes up while B holds the key, and again after B completed.
	err = a.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("A")}, time.Now().Add(time.Hour))
	if !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("stale A completes while B holds the key: got %v, want ErrLeaseLost", err)
	}
	if err := b.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("B")}, time.Now().Add(time.Hour)); err != nil {
		t.Fatalf("B completes: %v", err)
	}
	a2, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
	if err != nil || a2 != nil {
		t.Fatalf("after B completed: got txn %v, %v; want the record", a2, err)
	}

	// A second stale owner, this time after the takeover completed.
	key2 := idempotency.Key{ID: uniq("stale2")}
	c, _, err := f.store.Reserve(ctx, reservation(key2, "fp", 0))
	if err != nil || c == nil {
		t.Fatal(err)
	}
	_ = f.effect(ctx, c.Tx(), "stale2")
	crash(t, c)
	d, _, err := f.store.Reserve(ctx, reservation(key2, "fp", 10*time.Second))
	if err != nil || d == nil {
		t.Fatal(err)
	}
	_ = f.effect(ctx, d.Tx(), "stale2")
	if err := d.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("D")}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("C")}, time.Now().Add(time.Hour)); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("stale C completes after D completed: got %v, want ErrLeaseLost", err)
	}

	for _, tc := range []struct {
		key  idempotency.Key
		tag  string
		body string
	}{{key, "stale", "B"}, {key2, "stale2", "D"}} {
		_, rec, err := f.store.Reserve(ctx, reservation(tc.key, "fp", 0))
		if err != nil || rec == nil || string(rec.Body) != tc.body || rec.Status != 201 {
			t.Fatalf("record of %q: got %+v, %v; want the new holder's %q", tc.key.ID, rec, err, tc.body)
		}
		if n, err := f.count(ctx, tc.tag); err != nil || n != 1 {
			t.Fatalf("effects %q: got %d, %v; want 1 (the stale owner's queued command must not apply)", tc.tag, n, err)
		}
	}
}

// TestTwentyCallersOneKey: one effect, twenty identical responses.
func TestTwentyCallersOneKey(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	f := newFixture(t, singleClient(t), 0, nil)
	g, err := idempotency.New(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := idempotency.Key{ID: uniq("twenty")}
	var calls atomic.Int64
	const n = 20
	resps := make([]idempotency.Response, n)
	errs := make([]error, n)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			resps[i], errs[i] = g.Do(ctx, key, "fp", func(tx *Tx) (idempotency.Response, error) {
				c := calls.Add(1)
				_ = f.effect(ctx, tx, "twenty")
				time.Sleep(50 * time.Millisecond)
				return idempotency.Response{
					Status: 201,
					Header: http.Header{"X-Call": {strconv.FormatInt(c, 10)}},
					Body:   []byte{0, 1, 2, byte(c), 0xff},
				}, nil
			})
		}()
	}
	close(gate)
	wg.Wait()
	executed := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if !resps[i].Replayed {
			executed++
		}
		if resps[i].Status != resps[0].Status || !bytes.Equal(resps[i].Body, resps[0].Body) ||
			resps[i].Header.Get("X-Call") != resps[0].Header.Get("X-Call") {
			t.Fatalf("caller %d got %d %v %x, caller 0 got %d %v %x", i, resps[i].Status, resps[i].Header, resps[i].Body,
				resps[0].Status, resps[0].Header, resps[0].Body)
		}
	}
	if executed != 1 || calls.Load() != 1 {
		t.Fatalf("executed %d, fn ran %d times; want 1 and 1", executed, calls.Load())
	}
	if c, err := f.count(ctx, "twenty"); err != nil || c != 1 {
		t.Fatalf("effects: got %d, %v; want 1", c, err)
	}
}

// TestWaitersWokenPromptly measures how soon waiters return after the
// holder completes; with a 30s lease the fallback poll is 1s, so only the
// wake-up makes them fast. Waiters on the holder's Store wait on the holder
// itself and take its record (each its own copy); waiters on another Store
// (another process) wait on the key's pub/sub channel. It logs, it does not
// assert speed.
func TestWaitersWokenPromptly(t *testing.T) {
	t.Skip("obsolete since Guard waits in memory for same-key callers (flight.go): this test counts store-level waiters of one Guard; to be rewritten with one Guard per caller")
	for _, remote := range []bool{false, true} {
		name := "Local"
		if remote {
			name = "Remote"
		}
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			f := newFixture(t, singleClient(t), 0, nil)
			s := f.store
			if remote {
				other := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(t)})
				t.Cleanup(func() { _ = other.Close() })
				var err error
				if s, err = New(other, &Config{Prefix: f.prefix}); err != nil {
					t.Fatal(err)
				}
			}
			g, err := idempotency.New(s, &idempotency.Config{WaitTimeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			key := idempotency.Key{ID: uniq("wake")}
			holder, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
			if err != nil || holder == nil {
				t.Fatalf("holder: %v, %v", holder, err)
			}
			const waiters = 5
			returned := make([]time.Time, waiters)
			resps := make([]idempotency.Response, waiters)
			errs := make([]error, waiters)
			var wg sync.WaitGroup
			for i := range waiters {
				wg.Go(func() {
					resps[i], errs[i] = g.Do(ctx, key, "fp", func(*Tx) (idempotency.Response, error) {
						return idempotency.Response{}, errors.New("a waiter must not run fn")
					})
					returned[i] = time.Now()
				})
			}
			wake := f.store.keysFor(key).wake
			waitFor(t, 10*time.Second, "the waiters", func() bool {
				n, err := f.client.PubSubNumSub(ctx, wake).Result()
				if remote {
					return err == nil && n[wake] == waiters
				}
				return err == nil && n[wake] == 0 && holder.(*txn).hold.waiters.Load() == waiters
			})
			_ = f.effect(ctx, holder.Tx(), "wake")
			hdr := http.Header{"X-A": {"1", "2"}, "x-raw": {""}, "Empty": {}}
			before := time.Now()
			if err := holder.Complete(ctx, idempotency.Response{Status: 201, Header: hdr, Body: []byte("done")}, time.Now().Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
			after := time.Now()
			hdr.Set("X-A", "changed by the holder's caller")
			wg.Wait()
			_, stored, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
			if err != nil || stored == nil {
				t.Fatalf("the stored record: %v, %v", stored, err)
			}
			for i := range waiters {
				r := resps[i]
				if errs[i] != nil || !r.Replayed || r.Status != 201 || string(r.Body) != "done" ||
					fmt.Sprintf("%#v", r.Header) != fmt.Sprintf("%#v", stored.Header) {
					t.Fatalf("waiter %d: got %+v, %v; want the replay of %+v", i, r, errs[i], stored)
				}
				t.Logf("waiter %d returned %v after Complete started (%v after it returned)",
					i, returned[i].Sub(before), returned[i].Sub(after))
			}
			// Each waiter owns what it got.
			resps[0].Header.Set("X-A", "mine")
			resps[0].Body[0] = 'D'
			if resps[1].Header.Get("X-A") != "1" || string(resps[1].Body) != "done" {
				t.Fatalf("waiters share their response: %+v", resps[1])
			}
			if c, err := f.count(ctx, "wake"); err != nil || c != 1 {
				t.Fatalf("effects: got %d, %v; want 1", c, err)
			}
		})
	}
}

// TestDeadHolderWakesWaiterAtLeaseExpiry: a waiter on a key whose holder
// died gets it once the lease runs out, without waiting for its poll.
func TestDeadHolderWakesWaiterAtLeaseExpiry(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	const lease = 300 * time.Millisecond
	f := newFixture(t, singleClient(t), 0, &Config{Lease: lease})
	key := idempotency.Key{ID: uniq("dead")}
	a, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
	if err != nil || a == nil {
		t.Fatal(err)
	}
	crash(t, a)
	start := time.Now()
	b, rec, err := f.store.Reserve(ctx, reservation(key, "fp", 10*time.Second))
	if err != nil || b == nil || rec != nil {
		t.Fatalf("waiter after the holder died: got %v, %v, %v; want the key", b, rec, err)
	}
	t.Logf("waiter got the key %v after the holder died (lease %v)", time.Since(start), lease)
	if err := b.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Rollback(ctx); err == nil {
		t.Fatal("second Rollback: got nil, want an error")
	}
}

// TestRolledBackWhenCtxCancelled: Rollback with a cancelled context frees
// the key, and the queued commands never run.
func TestRollbackWithCancelledContext(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	f := newFixture(t, singleClient(t), 0, nil)
	key := idempotency.Key{ID: uniq("rb")}
	a, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
	if err != nil || a == nil {
		t.Fatal(err)
	}
	_ = f.effect(ctx, a.Tx(), "rb")
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := a.Rollback(cctx); err != nil {
		t.Fatalf("Rollback with a cancelled ctx: %v", err)
	}
	b, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
	if err != nil || b == nil {
		t.Fatalf("after Rollback the key must be free: %v, %v", b, err)
	}
	if err := b.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := f.count(ctx, "rb"); err != nil || n != 0 {
		t.Fatalf("effects after Rollback: got %d, %v; want 0", n, err)
	}
}

// TestTxQueuesOnly: Exec is refused inside fn, Pipelined only queues, and
// the queued commands' results are there after Do.
func TestTxQueuesOnly(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	f := newFixture(t, singleClient(t), 0, nil)
	g, err := idempotency.New(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	var incr *goredis.IntCmd
	_, err = g.Do(ctx, idempotency.Key{ID: uniq("q")}, "fp", func(tx *Tx) (idempotency.Response, error) {
		if _, err := tx.Exec(ctx); !errors.Is(err, errExec) {
			return idempotency.Response{}, fmt.Errorf("Exec: got %v, want errExec", err)
		}
		cmds, err := tx.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			incr = p.IncrBy(ctx, tx.Key("n"), 5)
			return nil
		})
		if err != nil || len(cmds) != 1 {
			return idempotency.Response{}, fmt.Errorf("TxPipelined: %v, %d cmds", err, len(cmds))
		}
		if n, _ := f.client.Exists(ctx, tx.Key("n")).Result(); n != 0 {
			return idempotency.Response{}, errors.New("a queued command ran before completion")
		}
		return idempotency.Response{Status: 200}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if incr.Val() != 5 || incr.Err() != nil {
		t.Fatalf("queued INCRBY after Do: got %d, %v; want 5", incr.Val(), incr.Err())
	}
}

func TestNewValidates(t *testing.T) {
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = client.Close() })
	bad := []*Config{
		{Lease: time.Millisecond},
		{Lease: -time.Second},
		{Prefix: "new\nline:"},
		{Prefix: "empty{}tag:"},
		{Prefix: "open{tag:"},
		{Prefix: string(bytes.Repeat([]byte("p"), MaxPrefixLen+1))},
	}
	for _, c := range bad {
		if _, err := New(client, c); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("New(%+v): got %v, want ErrInvalidConfig", c, err)
		}
	}
	if _, err := New(nil, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New(nil client): got %v, want ErrInvalidConfig", err)
	}
	s, err := New(client, nil)
	if err != nil || s.prefix != DefaultPrefix || s.lease != DefaultLease || s.renewEvery != DefaultLease/3 {
		t.Fatalf("defaults: got %+v, %v", s, err)
	}
	if _, err := New(client, &Config{Prefix: "app:{idem}:", Lease: MinLease}); err != nil {
		t.Fatalf("prefix with a hash tag: %v", err)
	}
}

// TestKeysShareASlot: the record, its channel and Tx.Key names hash to one
// slot whatever the scope and id contain, and a prefix tag wins.
func TestKeysShareASlot(t *testing.T) {
	for _, prefix := range []string{"p:", "a}b{c}:", "x{y}z:"} {
		s, err := New(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}), &Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []idempotency.Key{{ID: "a"}, {Scope: "{x}", ID: "}{"}, {Scope: "ü", ID: "{}"}} {
			ks := s.keysFor(k)
			tx := &Tx{base: ks.base}
			want := hashSlot(ks.rec)
			for _, name := range []string{ks.wake, tx.Key("effects"), tx.Key("{other}")} {
				if got := hashSlot(name); got != want {
					t.Fatalf("prefix %q key %+v: %q in slot %d, record %q in %d", prefix, k, name, got, ks.rec, want)
				}
			}
		}
	}
}

// hashSlot is Redis Cluster's key slot (CRC16/XMODEM of the hash tag).
func hashSlot(key string) uint16 {
	if i := bytes.IndexByte([]byte(key), '{'); i >= 0 {
		if j := bytes.IndexByte([]byte(key[i+1:]), '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}

// roundTrips counts network round trips: one per command, one per pipeline.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (r *roundTrips) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		r.n.Add(1)
		return next(ctx, cmd)
	}
}
func (r *roundTrips) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		r.n.Add(1)
		return next(ctx, cmds)
	}
}

// TestRoundTrips logs the round trips of Do for a new key and a replay,
// and of the bare effect transaction.
func TestRoundTrips(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	rt := &roundTrips{}
	addr := testenv.RedisAddr(t)
	f := newFixture(t, func(int) goredis.UniversalClient {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		c.AddHook(rt)
		return c
	}, 0, nil)
	g, err := idempotency.New(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	fn := func(tx *Tx) (idempotency.Response, error) {
		_ = f.effect(ctx, tx, "rt")
		return idempotency.Response{Status: 201}, nil
	}
	bareTx := func() error {
		_, err := f.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			p.Incr(ctx, f.effectKey("bare"))
			return nil
		})
		return err
	}
	// Warm up the script cache and the pools (go-redis dials pipelines on
	// a pool of their own).
	if _, err := g.Do(ctx, idempotency.Key{ID: uniq("warm")}, "fp", fn); err != nil {
		t.Fatal(err)
	}
	if err := bareTx(); err != nil {
		t.Fatal(err)
	}
	key := idempotency.Key{ID: uniq("rt")}
	measure := func(what string, call func() error) int64 {
		before := rt.n.Load()
		if err := call(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		n := rt.n.Load() - before
		t.Logf("%s: %d round trips", what, n)
		return n
	}
	newKey := measure("Do, new key", func() error { _, err := g.Do(ctx, key, "fp", fn); return err })
	replay := measure("Do, replay", func() error { _, err := g.Do(ctx, key, "fp", fn); return err })
	bare := measure("bare effect MULTI/EXEC", bareTx)
	if replay != 1 || newKey != 3 || bare != 1 {
		t.Errorf("round trips: new key %d, replay %d, bare %d; want 3, 1, 1", newKey, replay, bare)
	}
}

// freePort reports whether port and its cluster bus port are free.
func freePort(port int) bool {
	for _, p := range []int{port, port + 10000} {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		_ = l.Close()
	}
	return true
}

func keyN(i int) idempotency.Key { return idempotency.Key{Scope: "n", ID: "key-" + strconv.Itoa(i)} }

func resp201(i int) idempotency.Response {
	return idempotency.Response{Status: 201, Body: []byte(strconv.Itoa(i))}
}

// TestQueuedCommandErrors: a command Redis refuses when it is queued aborts
// the whole transaction (nothing applied, key free); one that fails when it
// runs does not stop the others, and Complete reports it.
func TestQueuedCommandErrors(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	f := newFixture(t, singleClient(t), 0, nil)
	g, err := idempotency.New(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}

	key := idempotency.Key{ID: uniq("abort")}
	_, err = g.Do(ctx, key, "fp", func(tx *Tx) (idempotency.Response, error) {
		_ = f.effect(ctx, tx, "abort")
		tx.Do(ctx, "incr") // wrong arity: refused when queued
		return idempotency.Response{Status: 201}, nil
	})
	if !goredis.IsExecAbortError(err) {
		t.Fatalf("a command refused when queued: got %v, want EXECABORT", err)
	}
	if n, err := f.count(ctx, "abort"); err != nil || n != 0 {
		t.Fatalf("effects after EXECABORT: got %d, %v; want 0", n, err)
	}
	r, err := g.Do(ctx, key, "fp", func(tx *Tx) (idempotency.Response, error) {
		_ = f.effect(ctx, tx, "abort")
		return idempotency.Response{Status: 201}, nil
	})
	if err != nil || r.Replayed {
		t.Fatalf("after EXECABORT the key must be free: got %+v, %v", r, err)
	}

	key = idempotency.Key{ID: uniq("runtime")}
	notNumber := f.prefix + "not-a-number"
	if err := f.client.Set(ctx, notNumber, "abc", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err = g.Do(ctx, key, "fp", func(tx *Tx) (idempotency.Response, error) {
		tx.Incr(ctx, notNumber) // fails when EXEC runs it
		_ = f.effect(ctx, tx, "runtime")
		return idempotency.Response{Status: 201, Body: []byte("stored")}, nil
	})
	if err == nil {
		t.Fatal("a command failing inside EXEC: got nil, want its error")
	}
	t.Logf("run-time failure reported as: %v", err)
	if n, err := f.count(ctx, "runtime"); err != nil || n != 1 {
		t.Fatalf("the other queued command: got %d, %v; want 1 (Redis does not roll back)", n, err)
	}
	r, err = g.Do(ctx, key, "fp", func(*Tx) (idempotency.Response, error) {
		return idempotency.Response{}, errors.New("must replay")
	})
	if err != nil || !r.Replayed || string(r.Body) != "stored" {
		t.Fatalf("the key is completed despite the failed command: got %+v, %v", r, err)
	}
}

// interfere runs touch once, just before the first MULTI/EXEC that the
// client sends, i.e. after Complete's WATCH and token check.
type interfere struct {
	once  sync.Once
	touch func()
}

func (h *interfere) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *interfere) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return next
}
func (h *interfere) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "multi" {
			h.once.Do(h.touch)
		}
		return next(ctx, cmds)
	}
}

// TestWatchRace: a write to the record between Complete's check and its
// EXEC aborts the EXEC. A touch that leaves the caller the owner (a late
// renewal) is retried and succeeds; a takeover gives ErrLeaseLost and
// applies nothing.
func TestWatchRace(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	addr := testenv.RedisAddr(t)
	other := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { _ = other.Close() })
	for _, tc := range []struct {
		name     string
		touch    func(s *Store, rec string)
		wantErr  error
		wantRuns int
	}{
		{"LateRenewal", func(s *Store, rec string) {
			other.PExpire(ctx, rec, time.Minute)
		}, nil, 1},
		{"Takeover", func(s *Store, rec string) {
			other.HSet(ctx, rec, "owner", "someone-else")
		}, idempotency.ErrLeaseLost, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &interfere{}
			f := newFixture(t, hooked(addr, h), 0, nil)
			key := idempotency.Key{ID: uniq("race")}
			h.touch = func() { tc.touch(f.store, f.store.keysFor(key).rec) }
			txn, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
			if err != nil || txn == nil {
				t.Fatal(err)
			}
			_ = f.effect(ctx, txn.Tx(), "race")
			err = txn.Complete(ctx, idempotency.Response{Status: 201}, time.Now().Add(time.Hour))
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("Complete: got %v, want %v", err, tc.wantErr)
			}
			if n, err := f.count(ctx, "race"); err != nil || n != tc.wantRuns {
				t.Fatalf("effects: got %d, %v; want %d", n, err, tc.wantRuns)
			}
		})
	}
}

// TestRenewalKeepsKey: fn running for several leases keeps the key; a
// caller waiting meanwhile gets the replay, not the key.
func TestRenewalKeepsKey(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	const lease = 150 * time.Millisecond
	f := newFixture(t, singleClient(t), 0, &Config{Lease: lease})
	g, err := idempotency.New(f.store, &idempotency.Config{WaitTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	key := idempotency.Key{ID: uniq("renew")}
	var calls atomic.Int64
	fn := func(tx *Tx) (idempotency.Response, error) {
		calls.Add(1)
		_ = f.effect(ctx, tx, "renew")
		time.Sleep(5 * lease)
		return idempotency.Response{Status: 201, Body: []byte("slow")}, nil
	}
	holder := make(chan error, 1)
	go func() {
		_, err := g.Do(ctx, key, "fp", fn)
		holder <- err
	}()
	time.Sleep(lease / 2)
	r, err := g.Do(ctx, key, "fp", fn)
	if err != nil || !r.Replayed || string(r.Body) != "slow" {
		t.Fatalf("waiter: got %+v, %v; want the holder's response replayed", r, err)
	}
	if err := <-holder; err != nil {
		t.Fatalf("holder running for 5 leases: %v", err)
	}
	if n, err := f.count(ctx, "renew"); err != nil || n != 1 || calls.Load() != 1 {
		t.Fatalf("effects %d (%v), fn calls %d; want 1 and 1", n, err, calls.Load())
	}
}

// TestNoGoroutineGrowth: whatever way a Do ends (new key, replay, error,
// lease lost while fn runs, renewals, waiters in this Store and in another
// one), nothing it started is left running: the lease renewals of every
// reservation end with it.
func TestNoGoroutineGrowth(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	const lease = 90 * time.Millisecond // renewals every 30ms
	rt := &roundTrips{}
	f := newFixture(t, func(int) goredis.UniversalClient {
		c := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(t), PoolSize: 4})
		c.AddHook(rt)
		return c
	}, 0, &Config{Lease: lease})
	other := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(t), PoolSize: 4})
	t.Cleanup(func() { _ = other.Close() })
	remote, err := New(other, &Config{Prefix: f.prefix, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &idempotency.Config{WaitTimeout: 10 * time.Second}
	g, err := idempotency.New(f.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	gr, err := idempotency.New(remote, cfg)
	if err != nil {
		t.Fatal(err)
	}
	errFn := errors.New("fn fails")
	var effects int
	effect := func(d time.Duration) func(*Tx) (idempotency.Response, error) {
		return func(tx *Tx) (idempotency.Response, error) {
			_ = f.effect(ctx, tx, "growth")
			time.Sleep(d)
			return idempotency.Response{Status: 201, Body: []byte("ok")}, nil
		}
	}
	round := func(i int) {
		key := idempotency.Key{ID: uniq("g")}
		// A holder that renews its lease, with waiters here and elsewhere.
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for j := range errs {
			gj := g
			if j%2 == 1 {
				gj = gr
			}
			wg.Go(func() { _, errs[j] = gj.Do(ctx, key, "fp", effect(2*lease/3)) })
		}
		wg.Wait()
		for j, err := range errs {
			if err != nil {
				t.Fatalf("round %d, caller %d: %v", i, j, err)
			}
		}
		effects++
		if r, err := g.Do(ctx, key, "fp", effect(0)); err != nil || !r.Replayed {
			t.Fatalf("round %d, replay: %+v, %v", i, r, err)
		}
		if _, err := g.Do(ctx, idempotency.Key{ID: uniq("g")}, "fp", func(*Tx) (idempotency.Response, error) {
			return idempotency.Response{}, errFn
		}); !errors.Is(err, errFn) {
			t.Fatalf("round %d, failing fn: %v", i, err)
		}
		// The lease is taken from the holder while fn runs: its renewal
		// finds the token gone, and Complete reports the loss.
		lost := idempotency.Key{ID: uniq("g")}
		if _, err := g.Do(ctx, lost, "fp", func(tx *Tx) (idempotency.Response, error) {
			_ = f.effect(ctx, tx, "lost")
			if err := other.HSet(ctx, f.store.keysFor(lost).rec, "owner", "someone-else").Err(); err != nil {
				return idempotency.Response{}, err
			}
			time.Sleep(lease / 2)
			return idempotency.Response{Status: 201}, nil
		}); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Fatalf("round %d, lease lost: got %v, want ErrLeaseLost", i, err)
		}
		// A reservation given up without a Do, as a crashed caller's.
		txn, _, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: uniq("g")}, "fp", 0))
		if err != nil || txn == nil {
			t.Fatalf("round %d, reserve: %v, %v", i, txn, err)
		}
		if err := txn.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	settle := func() int {
		n := runtime.NumGoroutine()
		for range 20 {
			time.Sleep(25 * time.Millisecond)
			n = min(n, runtime.NumGoroutine())
		}
		return n
	}
	for i := range 3 { // warm up both pools
		round(i)
	}
	before := settle()
	const rounds = 40
	for i := range rounds {
		round(i)
	}
	sent := rt.n.Load()
	after := settle()
	if n := rt.n.Load() - sent; n != 0 {
		t.Fatalf("%d commands sent after every Do returned: a lease renewal outlived its reservation", n)
	}
	for deadline := time.Now().Add(5 * time.Second); after > before && time.Now().Before(deadline); {
		after = settle()
	}
	if after > before {
		t.Fatalf("goroutines grew from %d to %d over %d rounds", before, after, rounds)
	}
	f.store.mu.Lock()
	held := len(f.store.holds)
	f.store.mu.Unlock()
	if held != 0 {
		t.Fatalf("%d reservations still known to the Store after every Do returned", held)
	}
	if n, err := f.count(ctx, "growth"); err != nil || n != effects {
		t.Fatalf("effects: got %d, %v; want %d", n, err, effects)
	}
	if n, err := f.count(ctx, "lost"); err != nil || n != 0 {
		t.Fatalf("effects of holders that lost the lease: got %d, %v; want 0", n, err)
	}
	t.Logf("goroutines: %d before, %d after %d rounds", before, after, rounds)
}

// scriptCalls counts the reservation scripts run on one record and, once
// armed, holds the next one back (before it is sent, or after its reply
// with afterReply) until release is closed.
type scriptCalls struct {
	rec        string
	afterReply bool
	n          atomic.Int64
	armed      atomic.Bool
	held       chan struct{} // closed when a call is held back
	release    chan struct{}
}

func newScriptCalls() *scriptCalls {
	return &scriptCalls{held: make(chan struct{}), release: make(chan struct{})}
}

func (h *scriptCalls) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *scriptCalls) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		args := cmd.Args()
		if (cmd.Name() != "evalsha" && cmd.Name() != "eval") || len(args) < 4 || args[3] != h.rec {
			return next(ctx, cmd)
		}
		h.n.Add(1)
		hold := h.armed.CompareAndSwap(true, false)
		if hold && !h.afterReply {
			close(h.held)
			<-h.release
		}
		err := next(ctx, cmd)
		if hold && h.afterReply {
			close(h.held)
			<-h.release
		}
		return err
	}
}
func (h *scriptCalls) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// TestConcurrentCallersShareOneLook: callers of one key in one Store that
// arrive while another runs the reservation script wait for its answer
// instead of running their own: for a completed key they each get their own
// copy of the record; for a new key they wait on the caller that reserved
// it and get its record when it completes. One script call in all.
func TestConcurrentCallersShareOneLook(t *testing.T) {
	t.Skip("obsolete since Guard waits in memory for same-key callers (flight.go): this test counts store-level waiters of one Guard; to be rewritten with one Guard per caller")
	const n = 10
	for _, completed := range []bool{true, false} {
		name := "NewKey"
		if completed {
			name = "Completed"
		}
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			h := newScriptCalls()
			f := newFixture(t, hooked(testenv.RedisAddr(t), h), 0, nil)
			g, err := idempotency.New(f.store, nil)
			if err != nil {
				t.Fatal(err)
			}
			key := idempotency.Key{ID: uniq("share")}
			var calls atomic.Int64
			waiters := func() int32 {
				f.store.mu.Lock()
				defer f.store.mu.Unlock()
				w := int32(0)
				for _, hd := range f.store.holds {
					w += hd.waiters.Load()
				}
				return w
			}
			fn := func(tx *Tx) (idempotency.Response, error) {
				calls.Add(1)
				_ = f.effect(ctx, tx, "share")
				if !completed {
					// Every other caller waits on this one by now.
					waitFor(t, 10*time.Second, "the waiters", func() bool { return waiters() == n-1 })
				}
				return idempotency.Response{Status: 201, Header: http.Header{"X-A": {"a"}}, Body: []byte("shared")}, nil
			}
			if completed {
				if _, err := g.Do(ctx, key, "fp", fn); err != nil {
					t.Fatal(err)
				}
			}
			h.rec = f.store.keysFor(key).rec
			h.armed.Store(true)
			resps := make([]idempotency.Response, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			wg.Go(func() { resps[0], errs[0] = g.Do(ctx, key, "fp", fn) })
			<-h.held // the first caller's script is on its way
			for i := 1; i < n; i++ {
				wg.Go(func() { resps[i], errs[i] = g.Do(ctx, key, "fp", fn) })
			}
			waitFor(t, 10*time.Second, "the callers to join", func() bool {
				f.store.mu.Lock()
				defer f.store.mu.Unlock()
				l := f.store.looking[h.rec]
				return l != nil && l.joined != nil && l.joined.n == n-1
			})
			close(h.release)
			wg.Wait()
			replayed := 0
			for i := range n {
				r := resps[i]
				if errs[i] != nil || r.Status != 201 || r.Header.Get("X-A") != "a" || string(r.Body) != "shared" {
					t.Fatalf("caller %d: got %+v, %v", i, r, errs[i])
				}
				if r.Replayed {
					replayed++
				}
			}
			if want := n - 1; completed && replayed != n || !completed && replayed != want {
				t.Fatalf("%d of %d callers replayed", replayed, n)
			}
			if got := h.n.Load(); got != 1 {
				t.Fatalf("reservation scripts run: got %d, want 1 for %d callers", got, n)
			}
			if c, err := f.count(ctx, "share"); err != nil || c != 1 || calls.Load() != 1 {
				t.Fatalf("effects %d (%v), fn calls %d; want 1 and 1", c, err, calls.Load())
			}
			// Each caller owns what it got.
			resps[1].Header.Set("X-A", "mine")
			resps[1].Body[0] = 'S'
			if resps[2].Header.Get("X-A") != "a" || string(resps[2].Body) != "shared" {
				t.Fatalf("callers share their response: %+v", resps[2])
			}
		})
	}
}

// TestJoinedLookFails: when the caller whose reservation script others
// joined fails (here its context ends), the others look for themselves:
// one runs fn, the rest get its response.
func TestJoinedLookFails(t *testing.T) {
	t.Skip("obsolete since Guard waits in memory for same-key callers (flight.go): this test counts store-level waiters of one Guard; to be rewritten with one Guard per caller")
	const n = 6
	ctx := testCtx(t, 30*time.Second)
	h := newScriptCalls()
	f := newFixture(t, hooked(testenv.RedisAddr(t), h), 0, nil)
	g, err := idempotency.New(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := idempotency.Key{ID: uniq("fail")}
	h.rec = f.store.keysFor(key).rec
	h.armed.Store(true)
	var calls atomic.Int64
	fn := func(tx *Tx) (idempotency.Response, error) {
		calls.Add(1)
		_ = f.effect(ctx, tx, "fail")
		return idempotency.Response{Status: 201, Body: []byte("ok")}, nil
	}
	lctx, cancel := context.WithCancel(ctx)
	leader := make(chan error, 1)
	go func() { _, err := g.Do(lctx, key, "fp", fn); leader <- err }()
	<-h.held
	resps := make([]idempotency.Response, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { resps[i], errs[i] = g.Do(ctx, key, "fp", fn) })
	}
	waitFor(t, 10*time.Second, "the callers to join", func() bool {
		f.store.mu.Lock()
		defer f.store.mu.Unlock()
		l := f.store.looking[h.rec]
		return l != nil && l.joined != nil && l.joined.n == n
	})
	cancel()
	close(h.release)
	if err := <-leader; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled caller: got %v, want context.Canceled", err)
	}
	wg.Wait()
	executed := 0
	for i := range n {
		if errs[i] != nil || string(resps[i].Body) != "ok" {
			t.Fatalf("caller %d: got %+v, %v", i, resps[i], errs[i])
		}
		if !resps[i].Replayed {
			executed++
		}
	}
	if c, err := f.count(ctx, "fail"); err != nil || c != 1 || executed != 1 || calls.Load() != 1 {
		t.Fatalf("effects %d (%v), executed %d, fn calls %d; want 1, 1, 1", c, err, executed, calls.Load())
	}
}

// TestWokenWaiterLooksAfresh: a waiter woken by the holder's message looks
// at the key with a script sent after the wake-up, never with the answer of
// one that ran before it (that answer says pending, and the waiter would
// sleep until its poll). Here another caller's script ran before the
// completion and its reply is held back: the woken waiter must not wait for
// it.
func TestWokenWaiterLooksAfresh(t *testing.T) {
	t.Skip("obsolete since Guard waits in memory for same-key callers (flight.go): this test counts store-level waiters of one Guard; to be rewritten with one Guard per caller")
	ctx := testCtx(t, 30*time.Second)
	f := newFixture(t, singleClient(t), 0, nil)
	h := newScriptCalls()
	h.afterReply = true
	other := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(t)})
	other.AddHook(h)
	t.Cleanup(func() { _ = other.Close() })
	remote, err := New(other, &Config{Prefix: f.prefix}) // another process, as far as f.store knows
	if err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.New(remote, &idempotency.Config{WaitTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	key := idempotency.Key{ID: uniq("fresh")}
	h.rec = remote.keysFor(key).rec
	holder, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
	if err != nil || holder == nil {
		t.Fatalf("holder: %v, %v", holder, err)
	}
	fn := func(*Tx) (idempotency.Response, error) {
		return idempotency.Response{}, errors.New("a waiter must not run fn")
	}
	type result struct {
		r   idempotency.Response
		err error
	}
	first, second := make(chan result, 1), make(chan result, 1)
	go func() { r, err := g.Do(ctx, key, "fp", fn); first <- result{r, err} }()
	// The first waiter looked, subscribed, and looked again.
	waitFor(t, 10*time.Second, "the first waiter", func() bool {
		remote.mu.Lock()
		defer remote.mu.Unlock()
		return h.n.Load() == 2 && remote.looking[h.rec] == nil
	})
	h.armed.Store(true)
	go func() { r, err := g.Do(ctx, key, "fp", fn); second <- result{r, err} }()
	<-h.held // the second caller's script ran (pending); its reply waits
	if err := holder.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("done")}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-first:
		if res.err != nil || !res.r.Replayed || string(res.r.Body) != "done" {
			t.Fatalf("woken waiter: got %+v, %v; want the replay", res.r, res.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the woken waiter waits for a script that ran before its wake-up")
	}
	close(h.release)
	if res := <-second; res.err != nil || !res.r.Replayed || string(res.r.Body) != "done" {
		t.Fatalf("second waiter: got %+v, %v; want the replay", res.r, res.err)
	}
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
