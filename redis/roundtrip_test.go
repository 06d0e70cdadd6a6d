package redis

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// roundTrips counts network round trips: one per command, one per
// pipeline, except the handshake of a new connection. It also counts the
// scripts sent (EVAL, EVALSHA): a script costs Redis several times the
// work of the commands it runs.
type roundTrips struct{ n, scripts atomic.Int64 }

func (r *roundTrips) see(cmd goredis.Cmder) {
	if name := cmd.Name(); name == "eval" || name == "evalsha" {
		r.scripts.Add(1)
	}
}

func (r *roundTrips) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (r *roundTrips) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if cmd.Name() != "hello" { // a new connection's handshake
			r.n.Add(1)
		}
		r.see(cmd)
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) == 0 || cmds[0].Name() != "client" { // a new connection's handshake
			r.n.Add(1)
		}
		for _, cmd := range cmds {
			r.see(cmd)
		}
		return next(ctx, cmds)
	}
}

// TestRoundTrips counts the round trips of Do for a new key, a replay and
// a caller that waits for a holder, and of the bare effect transaction.
func TestRoundTrips(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	rt := &roundTrips{}
	addr := testenv.RedisAddr(t)
	f, g, fn := countedGuard(t, ctx, func(int) goredis.UniversalClient {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		c.AddHook(rt)
		return c
	})
	bareTx := func() error {
		_, err := f.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			p.Incr(ctx, f.effectKey("bare"))
			return nil
		})
		return err
	}
	// Warm up the script cache and the pools (go-redis dials pipelines on
	// a pool of their own).
	if _, err := g.Do(ctx, idempotency.Key{ID: testkit.Name("warm-")}, "fp", fn); err != nil {
		t.Fatal(err)
	}
	if err := bareTx(); err != nil {
		t.Fatal(err)
	}
	key := idempotency.Key{ID: testkit.Name("rt-")}
	measure := func(what string, call func() error) int64 {
		n, _ := rt.measure(t, what, call)
		return n
	}
	newKey, newKeyScripts := rt.measure(t, "Do, new key", func() error { _, err := g.Do(ctx, key, "fp", fn); return err })
	replay, replayScripts := rt.measure(t, "Do, replay", func() error { _, err := g.Do(ctx, key, "fp", fn); return err })
	bare := measure("bare effect MULTI/EXEC", bareTx)
	if replay != 1 || newKey != 2 || bare != 1 {
		t.Errorf("round trips: new key %d, replay %d, bare %d; want 2, 1, 1", newKey, replay, bare)
	}
	if newKeyScripts != 1 || replayScripts != 0 {
		t.Errorf("scripts: new key %d, replay %d; want 1 (the reservation), 0", newKeyScripts, replayScripts)
	}

	other := goredis.NewClient(&goredis.Options{Addr: addr}) // not counted
	t.Cleanup(func() { _ = other.Close() })
	remoteHolder, err := New(other, &Config{Prefix: f.prefix})
	if err != nil {
		t.Fatal(err)
	}
	gr, err := idempotency.New(remoteHolder, nil)
	if err != nil {
		t.Fatal(err)
	}

	// A caller of another Guard waits for a holder. Its first try (no
	// wait) finds the key held: the reservation pipeline, and UNWATCH. Its
	// waiting try runs the script once more; then, for a holder of its own
	// Store, it takes the holder's record in memory. For a holder in
	// another process it also subscribes (on a connection of its own),
	// looks again, and looks once more when woken.
	waiter := func(s *Store, holder *Store) int64 {
		gw, err := idempotency.New(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		key := idempotency.Key{ID: testkit.Name("rtw-")}
		held, _, err := holder.Reserve(ctx, reservation(key, "fp", 0))
		if err != nil || held == nil {
			t.Fatalf("holder: %v, %v", held, err)
		}
		before := rt.n.Load()
		done := make(chan error, 1)
		go func() {
			r, err := gw.Do(ctx, key, "fp", fn)
			if err == nil && !r.Replayed {
				err = errors.New("the waiter ran fn")
			}
			done <- err
		}()
		testkit.WaitUntil(t, 10*time.Second, "the waiter to wait", func() bool { return s.waiting.Load() == 1 })
		_ = f.effect(ctx, held.Tx(), "rt")
		if err := held.Complete(ctx, idempotency.Response{Status: 201}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		return rt.n.Load() - before
	}
	// A replay of a key completed by another process: this Store has not
	// seen it completed, so it takes the reservation pipeline and UNWATCH;
	// the next replay knows better.
	elsewhere := idempotency.Key{ID: testkit.Name("rte-")}
	if _, err := gr.Do(ctx, elsewhere, "fp", fn); err != nil {
		t.Fatal(err)
	}
	first := measure("Do, replay of a key completed elsewhere", func() error { _, err := g.Do(ctx, elsewhere, "fp", fn); return err })
	again := measure("Do, replay of it again", func() error { _, err := g.Do(ctx, elsewhere, "fp", fn); return err })
	if first != 2 || again != 1 {
		t.Errorf("round trips: replay of a key completed elsewhere %d, again %d; want 2, 1", first, again)
	}

	local := waiter(f.store, f.store) - (newKey - 1) // less the holder's Complete
	t.Logf("Do, waiter on a holder of its Store: %d round trips", local)
	remote := waiter(f.store, remoteHolder)
	t.Logf("Do, waiter on a holder in another process: %d round trips (plus a SUBSCRIBE on a connection of its own)", remote)
	if local != 3 || remote != 5 {
		t.Errorf("round trips: waiter on a local holder %d, on a remote one %d; want 3, 5", local, remote)
	}
}

// measure runs call and returns the round trips and scripts it took.
func (r *roundTrips) measure(t *testing.T, what string, call func() error) (trips, scripts int64) {
	t.Helper()
	n, sc := r.n.Load(), r.scripts.Load()
	if err := call(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	trips, scripts = r.n.Load()-n, r.scripts.Load()-sc
	t.Logf("%s: %d round trips, %d scripts", what, trips, scripts)
	return trips, scripts
}

// countedGuard returns a fixture on the client that newClient makes (with
// the round-trip counter's hooks where they see every command), a Guard
// on its store, and the fn of the round-trip tests: one effect, a 201.
func countedGuard(t *testing.T, ctx context.Context, newClient func(int) goredis.UniversalClient) (*fixture, *idempotency.Guard[*Tx], func(*Tx) (idempotency.Response, error)) {
	t.Helper()
	f := newFixture(t, newClient, 0, nil)
	g, err := idempotency.New(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	fn := func(tx *Tx) (idempotency.Response, error) {
		_ = f.effect(ctx, tx, "rt")
		return idempotency.Response{Status: 201}, nil
	}
	return f, g, fn
}
