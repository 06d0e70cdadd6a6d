package redis

import (
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestNoWatchLeftOnPool: a reservation arms WATCH on the record in its own
// round trip (see tryWatched). Whatever it finds (a completed key, a held
// key) and however it ends (fn fails, Complete, Rollback), no WATCH is left
// on the connection it gives back: a later MULTI/EXEC of the application
// on the same pooled connection (Client.Watch takes it from the pool the
// store uses; go-redis runs plain pipelines on a pool of their own) must
// not be aborted by a write to those records. The pool has one
// connection, so every call reuses it.
func TestNoWatchLeftOnPool(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	f := newFixture(t, singleClient(t), 1, nil)
	if f.store.single == nil {
		t.Fatal("a single-node client must take the WATCH-armed reservation")
	}
	other := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = other.Close() })
	elsewhere, err := New(other, &Config{Prefix: f.prefix}) // another process
	if err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.New(f.store, &idempotency.Config{WaitTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	ge, err := idempotency.New(elsewhere, nil)
	if err != nil {
		t.Fatal(err)
	}
	errFn := errors.New("fn fails")

	fresh := idempotency.Key{ID: testkit.Name("fresh-")}
	if _, err := g.Do(ctx, fresh, "fp", okFn); err != nil {
		t.Fatal(err)
	}
	completed := idempotency.Key{ID: testkit.Name("done-")}
	if _, err := ge.Do(ctx, completed, "fp", okFn); err != nil {
		t.Fatal(err)
	}
	if r, err := g.Do(ctx, completed, "fp", okFn); err != nil || !r.Replayed {
		t.Fatalf("replay of a key completed elsewhere: %+v, %v", r, err)
	}
	held := idempotency.Key{ID: testkit.Name("held-")}
	h, _, err := elsewhere.Reserve(ctx, reservation(held, "fp", 0))
	if err != nil || h == nil {
		t.Fatalf("holder elsewhere: %v, %v", h, err)
	}
	defer func() { _ = h.Rollback(ctx) }()
	if _, err := g.Do(ctx, held, "fp", okFn); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("a key held elsewhere, NoWait: got %v, want ErrInProgress", err)
	}
	failed := idempotency.Key{ID: testkit.Name("failed-")}
	if _, err := g.Do(ctx, failed, "fp", func(*Tx) (idempotency.Response, error) {
		return idempotency.Response{}, errFn
	}); !errors.Is(err, errFn) {
		t.Fatalf("fn fails: %v", err)
	}
	rolled := idempotency.Key{ID: testkit.Name("rolled-")}
	txn, _, err := f.store.Reserve(ctx, reservation(rolled, "fp", 0))
	if err != nil || txn == nil {
		t.Fatalf("reserve: %v, %v", txn, err)
	}
	if err := txn.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Writes to every record the store looked at, then the application's
	// own transaction on the store's one pooled connection.
	for _, k := range []idempotency.Key{completed, held, failed, rolled, fresh} {
		if err := other.HSet(ctx, f.store.keysFor(k).rec, "touched", "1").Err(); err != nil {
			t.Fatal(err)
		}
	}
	app := func(tx *goredis.Tx) error {
		_, err := tx.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			p.Incr(ctx, f.effectKey("app"))
			return nil
		})
		return err
	}
	if err := f.client.(*goredis.Client).Watch(ctx, app); err != nil {
		t.Fatalf("the application's MULTI/EXEC after the store's calls: %v (a WATCH was left on the connection)", err)
	}
	if st := f.client.PoolStats(); st.TotalConns != 1 || st.IdleConns != 1 {
		t.Fatalf("pool after every call returned: %d connections, %d idle; want 1 and 1", st.TotalConns, st.IdleConns)
	}
}
