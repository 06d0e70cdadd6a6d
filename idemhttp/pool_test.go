package idemhttp_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestWaitersHoldNoPool is the pool starvation by waiters, over real HTTP on PostgreSQL with a
// pool of 4 connections: one slow key and 50 waiters of that key used to
// take every connection of the pool (an unguarded route on the same pool
// took 2.15 s instead of 2 ms, another tenant's key 5 s). Now the waiters
// of one key wait in memory, at most one of them inside the database per
// process, and at most Config.MaxWaiters calls of a Guard hold a
// connection to wait: the connections they hold stay within
// MaxWaiters + 1 (the slow key's own included), and the unguarded route
// and another tenant's new key are answered while the slow key is still
// held. No speed is asserted; BenchmarkUnrelatedLatency measures it.
func TestWaitersHoldNoPool(t *testing.T) {
	t.Parallel()
	const waiters = 50
	bound := int32(defaultMaxWaiters + 1)
	d := newPoolDB(t)
	hs := &holds{}
	cfg := &idempotency.Config{WaitTimeout: 2 * time.Minute} // MaxWaiters: the default
	a := newPoolService(t, d, poolSize, cfg, hs)             // the service under test
	b := newPoolService(t, d, poolSize, cfg, hs)             // another process on the same tables
	hc := newClient(t)

	// run holds key on holder, sends 50 requests of it to a, checks the
	// connections of a's pool and unrelated traffic while the key is held,
	// then releases it and checks that every waiter got the holder's answer.
	run := func(t *testing.T, holder *poolService, key string, wantMost int32) {
		h := hs.add("A/" + key)
		defer h.free()
		first := launch(hc, 1, holder.url+"/pay", "A", key, time.Minute)
		h.await(t)
		ws := launch(hc, waiters, a.url+"/pay", "A", key, time.Minute)
		base := int64(0)
		if holder == a {
			base = 1
		}
		testkit.WaitUntil(t, 30*time.Second, "the 50 waiters to be in flight", func() bool { return a.inflight.Load() == base+waiters })
		most := maxAcquired(a.pool, 300*time.Millisecond)
		t.Logf("connections of a's pool acquired with 50 waiters: at most %d (pool %d)", most, poolSize)
		if most > bound {
			t.Errorf("the 50 waiters and the slow key held %d of the pool's %d connections, want at most MaxWaiters+1 = %d", most, poolSize, bound)
		}
		if most > wantMost {
			t.Errorf("%d connections acquired, want at most %d: one database waiter per key per process", most, wantMost)
		}
		unrelated(t, hc, a, d, "new-"+key)
		select {
		case <-first:
			t.Fatal("the slow key was answered before its release: the checks above proved nothing")
		default:
		}
		h.free()
		want := (<-first)[0]
		if want.err != nil || want.status != http.StatusCreated {
			t.Fatalf("slow key: %d %q %v; want 201", want.status, want.body, want.err)
		}
		for i, r := range <-ws {
			if r.err != nil || r.status != http.StatusCreated || r.body != want.body || r.header.Get(idemhttp.HeaderReplayed) != "true" {
				t.Errorf("waiter %d: %d %q replayed=%q (%v); want the slow key's 201 %q replayed", i, r.status, r.body, r.header.Get(idemhttp.HeaderReplayed), r.err, want.body)
			}
		}
		if n := d.count(t, a.pool, "A/"+key); n != 1 {
			t.Errorf("%d effects for the slow key, want 1", n)
		}
	}
	// The slow key runs in a: its 50 waiters wait in memory and hold no
	// connection; the slow key's transaction holds one.
	t.Run("HeldHere", func(t *testing.T) { run(t, a, "slow-here", 1) })
	// The slow key runs in another process: one of a's 50 waiters waits
	// inside the database, the others in memory.
	t.Run("HeldElsewhere", func(t *testing.T) { run(t, b, "slow-there", 1) })
	t.Run("BeyondMaxWaiters", func(t *testing.T) { beyondMaxWaiters(t, hc, a, b, d, hs) })
}

// beyondMaxWaiters: four keys held by another process, one request for each
// in a: MaxWaiters (2) of them wait inside the database, the other two are
// answered 409 in progress with Retry-After at once, and the pool keeps
// connections for unrelated traffic.
func beyondMaxWaiters(t *testing.T, hc *http.Client, a, b *poolService, d *poolDB, hs *holds) {
	keys := []string{"k1", "k2", "k3", "k4"}
	firsts := map[string]<-chan []reply{}
	var hl []*hold
	for _, k := range keys {
		h := hs.add("A/" + k)
		defer h.free()
		hl = append(hl, h)
		firsts[k] = launch(hc, 1, b.url+"/pay", "A", k, time.Minute)
		h.await(t)
	}
	answers := make(chan reply, len(keys))
	for _, k := range keys {
		go func() { answers <- call(hc, http.MethodPost, a.url+"/pay", "A", k, time.Minute) }()
	}
	var refused []reply
	for range len(keys) - defaultMaxWaiters {
		select {
		case r := <-answers:
			refused = append(refused, r)
		case <-time.After(30 * time.Second):
			t.Fatal("no call was refused past MaxWaiters")
		}
	}
	for _, r := range refused {
		if r.err != nil || r.status != http.StatusConflict || r.header.Get("Retry-After") == "" {
			t.Errorf("past MaxWaiters: %d %q %v; want 409 with Retry-After", r.status, r.body, r.err)
			continue
		}
		var p idemhttp.Problem
		if err := json.Unmarshal([]byte(r.body), &p); err != nil || p.Type != idemhttp.ProblemInProgress {
			t.Errorf("past MaxWaiters: problem %q (%v), want type %s", r.body, err, idemhttp.ProblemInProgress)
		}
	}
	testkit.WaitUntil(t, 30*time.Second, "MaxWaiters calls waiting", func() bool { return a.inflight.Load() == int64(defaultMaxWaiters) })
	if most := maxAcquired(a.pool, 300*time.Millisecond); most > int32(defaultMaxWaiters) {
		t.Errorf("%d connections acquired by calls waiting for keys held elsewhere, want at most MaxWaiters = %d", most, defaultMaxWaiters)
	}
	unrelated(t, hc, a, d, "new-beyond")
	for _, h := range hl {
		h.free()
	}
	for range defaultMaxWaiters {
		r := <-answers
		if r.err != nil || r.status != http.StatusCreated || r.header.Get(idemhttp.HeaderReplayed) != "true" {
			t.Errorf("a waiting call: %d %q %v; want the holder's 201 replayed", r.status, r.body, r.err)
		}
	}
	for _, k := range keys {
		if r := (<-firsts[k])[0]; r.status != http.StatusCreated {
			t.Errorf("holder of %s: %d %q %v", k, r.status, r.body, r.err)
		}
		if n := d.count(t, a.pool, "A/"+k); n != 1 {
			t.Errorf("%d effects for %s, want 1", n, k)
		}
	}
}

// unrelated sends the traffic that must not wait for the slow key: the
// unguarded route on the same pool, and another tenant's new key, each
// bounded by a generous 15 s (they used to wait for the slow key).
func unrelated(t *testing.T, hc *http.Client, s *poolService, d *poolDB, key string) {
	t.Helper()
	for range 3 {
		if r := call(hc, http.MethodGet, s.url+"/unguarded", "", "", 15*time.Second); r.err != nil || r.status != http.StatusOK {
			t.Errorf("unguarded route on the same pool: %d %q %v; want 200 while the slow key is held", r.status, r.body, r.err)
		}
	}
	if r := call(hc, http.MethodPost, s.url+"/pay", "B", key, 15*time.Second); r.err != nil || r.status != http.StatusCreated {
		t.Errorf("another tenant's new key: %d %q %v; want 201 while the slow key is held", r.status, r.body, r.err)
	}
	if n := d.count(t, s.pool, "B/"+key); n != 1 {
		t.Errorf("%d effects for tenant B's key, want 1", n)
	}
}

// defaultMaxWaiters is idempotency.Config's default MaxWaiters.
const defaultMaxWaiters = 2
