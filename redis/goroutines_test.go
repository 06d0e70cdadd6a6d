package redis

import (
	"errors"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestNoGoroutineGrowth: whatever way a Do ends (new key, replay, error,
// lease lost while fn runs, renewals, waiters in this Store and in another
// one), nothing it started is left running: the lease renewals of every
// reservation end with it.
func TestNoGoroutineGrowth(t *testing.T) {
	ctx := testkit.Context(t, 60*time.Second)
	const lease = 300 * time.Millisecond // renewals every 100ms: room for a loaded machine
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
		key := idempotency.Key{ID: testkit.Name("g-")}
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
		if _, err := g.Do(ctx, idempotency.Key{ID: testkit.Name("g-")}, "fp", func(*Tx) (idempotency.Response, error) {
			return idempotency.Response{}, errFn
		}); !errors.Is(err, errFn) {
			t.Fatalf("round %d, failing fn: %v", i, err)
		}
		// The lease is taken from the holder while fn runs: its renewal
		// finds the token gone, and Complete reports the loss.
		lost := idempotency.Key{ID: testkit.Name("g-")}
		if _, err := g.Do(ctx, lost, "fp", func(tx *Tx) (idempotency.Response, error) {
			_ = f.effect(ctx, tx, "lost")
			if err := other.HSet(ctx, f.store.keysFor(lost).rec, "owner", "someone-else").Err(); err != nil {
				return idempotency.Response{}, err
			}
			time.Sleep(lease / 2)
			return idempotency.Response{Status: 201}, nil
		}); !errors.Is(err, backend.ErrLeaseLost) {
			t.Fatalf("round %d, lease lost: got %v, want ErrLeaseLost", i, err)
		}
		// A reservation given up without a Do, as a crashed caller's.
		txn, _, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: testkit.Name("g-")}, "fp", 0))
		if err != nil || txn == nil {
			t.Fatalf("round %d, reserve: %v, %v", i, txn, err)
		}
		if err := txn.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	settle := testkit.Goroutines
	for i := range 3 { // warm up both pools
		round(i)
	}
	before := settle()
	const rounds = 20
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
