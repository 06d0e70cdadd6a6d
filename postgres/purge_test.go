package postgres_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// TestPurgeSkipsHeldRows: Purge deletes expired rows but neither waits for
// nor deletes a row an open transaction holds: a row locked by another
// transaction, and under SERIALIZABLE the pending row of an expired key
// being taken over. Under READ COMMITTED a takeover holds the key by its
// advisory lock and writes the key row only when it completes, so Purge may
// delete the old expired row meanwhile; the completion stores the answer
// all the same.
func TestPurgeSkipsHeldRows(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  postgres.Config
		want int // rows Purge deletes: a, b, c and, unless held, "held"
	}{
		{"ReadCommitted", postgres.Config{}, 4},
		{"Serializable", postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testkit.Context(t, testTimeout)
			var now atomic.Pointer[time.Time]
			start := time.Now()
			now.Store(&start)
			c.cfg.Clock = func() time.Time { return *now.Load() }
			f := newFixture(t, newPool(t, 3), c.cfg)
			g := f.guard(t, &idempotency.Config{TTL: time.Hour})
			fn := func(tx pgx.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 200}, f.effect(ctx, tx, "p")
			}
			for _, id := range []string{"a", "b", "c", "held", "locked"} {
				if _, err := g.Do(ctx, idempotency.Key{ID: id}, "fp", fn); err != nil {
					t.Fatal(err)
				}
			}
			later := start.Add(2 * time.Hour)
			now.Store(&later)
			// Another transaction locks the expired row of "locked".
			locker, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = locker.Rollback(context.WithoutCancel(ctx)) }()
			if _, err := locker.Exec(ctx, `SELECT 1 FROM "`+f.table+`" WHERE id = 'locked' FOR UPDATE`); err != nil {
				t.Fatal(err)
			}
			held, release := make(chan struct{}), testkit.NewGate(t)
			done := make(chan error, 1)
			go func() {
				_, err := g.Do(ctx, idempotency.Key{ID: "held"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
					close(held)
					<-release.Opened()
					return fn(tx)
				})
				done <- err
			}()
			select {
			case <-held:
			case err := <-done:
				t.Fatalf("takeover of the expired key: %v", err)
			}
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			n, err := f.store.Purge(pctx, 100)
			cancel()
			release.Open()
			if err != nil || n != c.want {
				t.Fatalf("Purge with held rows: got %d, %v; want %d (and no wait)", n, err, c.want)
			}
			if err := <-done; err != nil {
				t.Fatalf("takeover: %v", err)
			}
			r, err := g.Do(ctx, idempotency.Key{ID: "held"}, "fp", fn)
			if err != nil || !r.Replayed {
				t.Fatalf("taken-over key after Purge: got %+v, %v; want replayed", r, err)
			}
			_ = locker.Rollback(ctx)
			if n, err := f.store.Purge(ctx, 100); err != nil || n != 1 {
				t.Fatalf("Purge once the lock is gone: got %d, %v; want 1 (the row that was locked)", n, err)
			}
			testkit.MustCount(t, ctx, f.count, "p", 6)
		})
	}
}
