package redis

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestLeaseTakeoverDuplicatesExternalEffect shows the documented limit: a
// holder that dies after an effect outside Redis leaves the key to a retry
// once its lease expires, and the effect runs twice. The same crash with
// the effect queued on the pipeline leaves one effect.
func TestLeaseTakeoverDuplicatesExternalEffect(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	const lease = 200 * time.Millisecond
	f := newFixture(t, singleClient(t), 0, &Config{Lease: lease})
	g, err := idempotency.New(f.store, &idempotency.Config{WaitTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("ExternalEffect", func(t *testing.T) {
		key := idempotency.Key{ID: testkit.Name("ext-")}
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
		key := idempotency.Key{ID: testkit.Name("pipe-")}
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
	ctx := testkit.Context(t, 30*time.Second)
	f := newFixture(t, singleClient(t), 0, &Config{Lease: 150 * time.Millisecond})
	key := idempotency.Key{Scope: "s", ID: testkit.Name("stale-")}

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
	err = a.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("A")})
	if !errors.Is(err, backend.ErrLeaseLost) {
		t.Fatalf("stale A completes while B holds the key: got %v, want ErrLeaseLost", err)
	}
	if err := b.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("B")}); err != nil {
		t.Fatalf("B completes: %v", err)
	}
	a2, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
	if err != nil || a2 != nil {
		t.Fatalf("after B completed: got txn %v, %v; want the record", a2, err)
	}

	// A second stale owner, this time after the takeover completed.
	key2 := idempotency.Key{ID: testkit.Name("stale2-")}
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
	if err := d.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("D")}); err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("C")}); !errors.Is(err, backend.ErrLeaseLost) {
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

// TestDeadHolderWakesWaiterAtLeaseExpiry: a waiter on a key whose holder
// died gets it once the lease runs out, without waiting for its poll.
func TestDeadHolderWakesWaiterAtLeaseExpiry(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	const lease = 300 * time.Millisecond
	f := newFixture(t, singleClient(t), 0, &Config{Lease: lease})
	key := idempotency.Key{ID: testkit.Name("dead-")}
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

// TestRenewalKeepsKey: fn running for several leases keeps the key; a
// caller waiting meanwhile gets the replay, not the key.
func TestRenewalKeepsKey(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	const lease = 400 * time.Millisecond // renewals every 133ms: room for a loaded machine
	f := newFixture(t, singleClient(t), 0, &Config{Lease: lease})
	g, err := idempotency.New(f.store, &idempotency.Config{WaitTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	key := idempotency.Key{ID: testkit.Name("renew-")}
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
