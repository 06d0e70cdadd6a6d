package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/postgres"
)

// TestLockTimeoutScopedToReservation: the wait bound is a lock_timeout for
// the reservation statement only; fn and later users of the connection see
// the session's own setting.
func TestLockTimeoutScopedToReservation(t *testing.T) {
	ctx := testContext(t)
	sessionTimeout := func(c *pgxpool.Config) {
		c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "SET lock_timeout = '7s'")
			return err
		}
	}
	cases := []struct {
		name      string
		configure []func(*pgxpool.Config)
		cfg       *idempotency.Config
		want      string
	}{
		{"ServerDefault", nil, nil, "0"},
		{"SessionSetting", []func(*pgxpool.Config){sessionTimeout}, &idempotency.Config{WaitTimeout: 300 * time.Millisecond}, "7s"},
		{"SessionSettingNoWait", []func(*pgxpool.Config){sessionTimeout}, &idempotency.Config{NoWait: true}, "7s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pool := newPool(t, 1, c.configure...)
			f := newFixture(t, pool, postgres.Config{})
			cfg := idempotency.Config{TTL: time.Hour}
			if c.cfg != nil {
				cfg = *c.cfg
			}
			now := time.Now()
			cfg.TTL, cfg.Now = time.Hour, func() time.Time { return now }
			g := f.guard(t, &cfg)
			// A new key (the INSERT), then the same key once expired (the
			// takeover UPDATE): each sets and restores the bound.
			for _, step := range []string{"new key", "expired key taken over"} {
				var inFn string
				r, err := g.Do(ctx, idempotency.Key{ID: "k"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
					return idempotency.Response{Status: 200}, tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&inFn)
				})
				if err != nil || r.Replayed || inFn != c.want {
					t.Fatalf("%s: lock_timeout inside fn: got %q, %+v, %v; want %q", step, inFn, r, err, c.want)
				}
				var after string
				if err := pool.QueryRow(ctx, "SHOW lock_timeout").Scan(&after); err != nil || after != c.want {
					t.Fatalf("%s: lock_timeout of the connection after Do: got %q, %v; want %q", step, after, err, c.want)
				}
				now = now.Add(2 * time.Hour)
			}
		})
	}
}

// TestReplayLocksNothing: a replay neither takes nor waits for a lock on
// the completed row (ON CONFLICT DO NOTHING; DO UPDATE would lock the row,
// and the waiters of a key would then wake up one after another): with the
// row locked by another transaction, a replay with NoWait still succeeds.
func TestReplayLocksNothing(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t, 2)
	f := newFixture(t, pool, postgres.Config{})
	for _, noWait := range []bool{false, true} {
		g := f.guard(t, &idempotency.Config{NoWait: noWait})
		key := idempotency.Key{ID: fmt.Sprintf("k-%v", noWait)}
		fn := func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte("once")}, f.effect(ctx, tx, "locks")
		}
		if _, err := g.Do(ctx, key, "fp", fn); err != nil {
			t.Fatal(err)
		}
		locker, err := pgx.Connect(ctx, testenv.PostgresDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		ltx, err := locker.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ltx.Exec(ctx, `SELECT 1 FROM "`+f.table+`" WHERE id = $1 FOR UPDATE`, key.ID); err != nil {
			t.Fatal(err)
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := g.Do(dctx, key, "fp", fn)
		cancel()
		_ = ltx.Rollback(ctx)
		_ = locker.Close(ctx)
		if err != nil || !r.Replayed || string(r.Body) != "once" {
			t.Fatalf("NoWait %v: replay while another transaction locks the row: got %+v, %v; want the stored response", noWait, r, err)
		}
	}
	f.mustCount(t, ctx, "locks", 2)
}

// TestNoGrowth: thousands of keys (new, replayed, failed) leave the number
// of goroutines and the live heap where they were.
func TestNoGrowth(t *testing.T) {
	ctx := testContext(t)
	f := newFixture(t, newPool(t, 4), postgres.Config{})
	g := f.guard(t, nil)
	errFn := errors.New("fn fails")
	round := func(i int) {
		key := idempotency.Key{ID: fmt.Sprintf("g-%d", i)}
		fn := func(tx pgx.Tx) (idempotency.Response, error) {
			if i%10 == 9 {
				return idempotency.Response{}, errFn
			}
			return idempotency.Response{Status: 201, Header: http.Header{"A": {"b"}}, Body: []byte("body")}, f.effect(ctx, tx, "growth")
		}
		if _, err := g.Do(ctx, key, "fp", fn); err != nil && !errors.Is(err, errFn) {
			t.Fatalf("key %d: %v", i, err)
		}
		if i%2 == 0 {
			if _, err := g.Do(ctx, key, "fp", fn); err != nil && !errors.Is(err, errFn) {
				t.Fatalf("key %d again: %v", i, err)
			}
		}
	}
	measure := func() (goroutines int, heap uint64) {
		var ms runtime.MemStats
		for range 3 {
			runtime.GC()
		}
		runtime.ReadMemStats(&ms)
		return runtime.NumGoroutine(), ms.HeapAlloc
	}
	var wg sync.WaitGroup
	parallel := func(from, to int) {
		for w := range 4 {
			wg.Go(func() {
				for i := from + w; i < to; i += 4 {
					round(i)
				}
			})
		}
		wg.Wait()
	}
	parallel(0, 400) // warm the pool and the statement caches
	g0, h0 := measure()
	const keys = 3000
	parallel(400, 400+keys)
	g1, h1 := measure()
	t.Logf("goroutines %d -> %d, live heap %d -> %d bytes over %d keys", g0, g1, h0, h1, keys)
	if g1 > g0 {
		t.Errorf("goroutines grew from %d to %d over %d keys", g0, g1, keys)
	}
	// 256 KiB over 3000 keys: a leak of 90 bytes per key would show.
	if h1 > h0+256<<10 {
		t.Errorf("live heap grew from %d to %d bytes over %d keys", h0, h1, keys)
	}
	f.mustCount(t, ctx, "growth", (400+keys)*9/10)
}

// TestTxBehaviour: the pgx.Tx fn receives works like pgx's own inside fn
// (statements, batches, COPY, prepared statements, savepoints), refuses
// Commit, and is closed once Do returns.
func TestTxBehaviour(t *testing.T) {
	ctx := testContext(t)
	f := newFixture(t, newPool(t, 2), postgres.Config{})
	g := f.guard(t, nil)
	insert := "INSERT INTO " + f.effects + " (tag) VALUES ($1)"

	var kept, keptSavepoint pgx.Tx
	_, err := g.Do(ctx, idempotency.Key{ID: "full"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		kept = tx
		if _, err := tx.Exec(ctx, insert, "exec"); err != nil {
			return idempotency.Response{}, err
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+f.effects+" WHERE tag = 'exec'").Scan(&n); err != nil || n != 1 {
			return idempotency.Response{}, errors.New("QueryRow does not see the transaction's own insert")
		}
		rows, err := tx.Query(ctx, "SELECT tag FROM "+f.effects)
		if err != nil {
			return idempotency.Response{}, err
		}
		tags, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(tags) != 1 {
			return idempotency.Response{}, errors.Join(errors.New("Query"), err)
		}
		b := &pgx.Batch{}
		b.Queue(insert, "batch")
		b.Queue(insert, "batch")
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return idempotency.Response{}, err
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{f.effects}, []string{"tag"}, pgx.CopyFromRows([][]any{{"copy"}, {"copy"}, {"copy"}})); err != nil {
			return idempotency.Response{}, err
		}
		if _, err := tx.Prepare(ctx, "ins", insert); err != nil {
			return idempotency.Response{}, err
		}
		if _, err := tx.Exec(ctx, "ins", "prepared"); err != nil {
			return idempotency.Response{}, err
		}
		if _, err := tx.Conn().Exec(ctx, insert, "conn"); err != nil {
			return idempotency.Response{}, err
		}
		// A savepoint rolled back discards only its own work...
		sp, err := tx.Begin(ctx)
		if err != nil {
			return idempotency.Response{}, err
		}
		if _, err := sp.Exec(ctx, insert, "undone"); err != nil {
			return idempotency.Response{}, err
		}
		if err := sp.Rollback(ctx); err != nil {
			return idempotency.Response{}, err
		}
		// ...one released keeps it, even after a failed statement inside.
		sp, err = tx.Begin(ctx)
		if err != nil {
			return idempotency.Response{}, err
		}
		inner, err := sp.Begin(ctx)
		if err != nil {
			return idempotency.Response{}, err
		}
		if _, err := inner.Exec(ctx, "SELECT 1/0"); err == nil {
			return idempotency.Response{}, errors.New("1/0 did not fail")
		}
		if err := inner.Rollback(ctx); err != nil {
			return idempotency.Response{}, err
		}
		if _, err := sp.Exec(ctx, insert, "savepoint"); err != nil {
			return idempotency.Response{}, err
		}
		if err := sp.Commit(ctx); err != nil {
			return idempotency.Response{}, err
		}
		keptSavepoint, err = tx.Begin(ctx)
		if err != nil {
			return idempotency.Response{}, err
		}
		if err := tx.Commit(ctx); err == nil {
			return idempotency.Response{}, errors.New("Commit inside fn succeeded, want an error")
		}
		return idempotency.Response{Status: http.StatusCreated}, nil
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	for tag, want := range map[string]int{"exec": 1, "batch": 2, "copy": 3, "prepared": 1, "conn": 1, "undone": 0, "savepoint": 1} {
		f.mustCount(t, ctx, tag, want)
	}
	for name, tx := range map[string]pgx.Tx{"tx": kept, "savepoint": keptSavepoint} {
		closedErrs := map[string]error{}
		_, closedErrs["Exec"] = tx.Exec(ctx, insert, "late")
		_, closedErrs["Query"] = tx.Query(ctx, "SELECT 1")
		closedErrs["QueryRow"] = tx.QueryRow(ctx, "SELECT 1").Scan(new(int))
		closedErrs["SendBatch"] = tx.SendBatch(ctx, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: "SELECT 1"}}}).Close()
		_, closedErrs["CopyFrom"] = tx.CopyFrom(ctx, pgx.Identifier{f.effects}, []string{"tag"}, pgx.CopyFromRows([][]any{{"late"}}))
		_, closedErrs["Prepare"] = tx.Prepare(ctx, "late", "SELECT 1")
		_, closedErrs["Begin"] = tx.Begin(ctx)
		closedErrs["Commit"] = tx.Commit(ctx)
		for m, err := range closedErrs {
			if !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("%s.%s after Do returned: got %v, want pgx.ErrTxClosed", name, m, err)
			}
		}
	}
	f.mustCount(t, ctx, "late", 0)

	// fn that rolls the transaction back: Do fails, nothing commits, the
	// key stays free.
	_, err = g.Do(ctx, idempotency.Key{ID: "rolled-back"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		if _, err := tx.Exec(ctx, insert, "rolled-back"); err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: 200}, tx.Rollback(ctx)
	})
	if !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("fn rolled back: got %v, want pgx.ErrTxClosed", err)
	}
	// fn that ignores a failed statement: the commit cannot happen.
	_, err = g.Do(ctx, idempotency.Key{ID: "aborted"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		if _, err := tx.Exec(ctx, insert, "aborted"); err != nil {
			return idempotency.Response{}, err
		}
		_, _ = tx.Exec(ctx, "SELECT 1/0")
		return idempotency.Response{Status: 200}, nil
	})
	if !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("fn ignored a failed statement: got %v, want pgx.ErrTxCommitRollback", err)
	}
	f.mustCount(t, ctx, "rolled-back", 0)
	f.mustCount(t, ctx, "aborted", 0)
	for _, id := range []string{"rolled-back", "aborted"} {
		r, err := g.Do(ctx, idempotency.Key{ID: id}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 200}, f.effect(ctx, tx, id)
		})
		if err != nil || r.Replayed {
			t.Fatalf("key %q after a failed attempt: got %+v, %v; want executed", id, r, err)
		}
		f.mustCount(t, ctx, id, 1)
	}
}

// TestRoundTrips counts the round trips of Do on a warm connection. By
// default a replay is one plain SELECT and a new key costs that one more
// than the bare effect transaction (BEGIN with the reservation, the effect,
// the completion with COMMIT: 3); with SkipLookup a new key costs 3 and a
// replay 2 (BEGIN with the look-up, ROLLBACK).
func TestRoundTrips(t *testing.T) {
	for _, c := range []struct {
		name                string
		cfg                 postgres.Config
		wantNew, wantReplay int64
	}{
		{"Default", postgres.Config{}, 4, 1},
		{"SkipLookup", postgres.Config{SkipLookup: true}, 3, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testContext(t)
			var queries atomic.Int64
			tr := &tracer{queries: &queries}
			f := newFixture(t, newPool(t, 1, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr }), c.cfg)
			g := f.guard(t, nil)
			fn := func(tx pgx.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 201, Header: http.Header{"A": {"b"}}, Body: []byte("x")}, f.effect(ctx, tx, "rt")
			}
			trips := func(do func()) int64 {
				q, b := queries.Load(), tr.batches.Load()
				do()
				return queries.Load() - q + tr.batches.Load() - b
			}
			// Warm the connection's statement cache: the first use of a
			// statement on a connection costs one more round trip to
			// prepare it.
			for _, id := range []string{"warm", "warm"} {
				if _, err := g.Do(ctx, idempotency.Key{ID: id}, "fp", fn); err != nil {
					t.Fatal(err)
				}
			}
			newKey := trips(func() {
				if r, err := g.Do(ctx, idempotency.Key{ID: "new"}, "fp", fn); err != nil || r.Replayed {
					t.Fatalf("new key: %+v, %v", r, err)
				}
			})
			replay := trips(func() {
				if r, err := g.Do(ctx, idempotency.Key{ID: "new"}, "fp", fn); err != nil || !r.Replayed {
					t.Fatalf("replay: %+v, %v", r, err)
				}
			})
			bare := trips(func() {
				if err := f.bare(ctx, "bare"); err != nil {
					t.Fatal(err)
				}
			})
			t.Logf("round trips: new key %d, replay %d, bare effect transaction %d", newKey, replay, bare)
			if newKey != c.wantNew || replay != c.wantReplay || bare != 3 {
				t.Fatalf("round trips: new key %d, want %d (one of them the effect); replay %d, want %d; bare %d, want 3",
					newKey, c.wantNew, replay, c.wantReplay, bare)
			}
		})
	}
}

// TestPurgeSkipsHeldRows: Purge deletes expired rows but neither waits for
// nor deletes a row an open transaction holds (here, an expired key being
// taken over).
func TestPurgeSkipsHeldRows(t *testing.T) {
	ctx := testContext(t)
	f := newFixture(t, newPool(t, 3), postgres.Config{})
	var now atomic.Pointer[time.Time]
	start := time.Now()
	now.Store(&start)
	g := f.guard(t, &idempotency.Config{TTL: time.Hour, Now: func() time.Time { return *now.Load() }})
	fn := func(tx pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 200}, f.effect(ctx, tx, "p")
	}
	for _, id := range []string{"a", "b", "c", "held"} {
		if _, err := g.Do(ctx, idempotency.Key{ID: id}, "fp", fn); err != nil {
			t.Fatal(err)
		}
	}
	later := start.Add(2 * time.Hour)
	now.Store(&later)
	held, release := make(chan struct{}), releaser(t)
	done := make(chan error, 1)
	go func() {
		_, err := g.Do(ctx, idempotency.Key{ID: "held"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			close(held)
			<-release.c
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
	n, err := f.store.Purge(pctx, later, 100)
	cancel()
	release.do()
	if err != nil || n != 3 {
		t.Fatalf("Purge with a held row: got %d, %v; want 3 (and no wait)", n, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("takeover: %v", err)
	}
	r, err := g.Do(ctx, idempotency.Key{ID: "held"}, "fp", fn)
	if err != nil || !r.Replayed {
		t.Fatalf("taken-over key after Purge: got %+v, %v; want replayed", r, err)
	}
	f.mustCount(t, ctx, "p", 5)
}

// TestCancelWhileWaitingReleasesConnection: a caller cancelled while its
// INSERT waits returns promptly, and the pool gets its connection slot
// back at once (a pool of 2: the holder's and the waiter's).
func TestCancelWhileWaitingReleasesConnection(t *testing.T) {
	t.Skip("obsolete since Guard waits in memory for same-key callers (flight.go): this test expects the callers of one Guard to queue in the database; to be rewritten with one Guard per caller")
	ctx := testContext(t)
	pool := newPool(t, 2)
	f := newFixture(t, pool, postgres.Config{})
	g := f.guard(t, nil)
	key := idempotency.Key{ID: "k"}
	held, release := make(chan struct{}), releaser(t)
	done := make(chan error, 1)
	go func() {
		_, err := g.Do(ctx, key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			close(held)
			<-release.c
			return idempotency.Response{Status: 200}, f.effect(ctx, tx, "holder")
		})
		done <- err
	}()
	<-held
	wctx, cancel := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() {
		_, err := g.Do(wctx, key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 200}, f.effect(ctx, tx, "waiter")
		})
		werr <- err
	}()
	waitBlocked(t, ctx, `%INSERT INTO "`+f.table+`"%`)
	cancel()
	select {
	case err := <-werr:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter: got %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled waiter did not return within 5s")
	}
	// The pool destroys a closed connection in the background.
	for deadline := time.Now().Add(2 * time.Second); pool.Stat().AcquiredConns() != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("acquired connections after the waiter returned: %d, want 1 (the holder's)", pool.Stat().AcquiredConns())
		}
	}
	// The freed slot serves another key while the holder still holds.
	if _, err := g.Do(ctx, idempotency.Key{ID: "other"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 200}, f.effect(ctx, tx, "other")
	}); err != nil {
		t.Fatalf("another key after the cancel: %v", err)
	}
	release.do()
	if err := <-done; err != nil {
		t.Fatalf("holder: %v", err)
	}
	f.mustCount(t, ctx, "holder", 1)
	f.mustCount(t, ctx, "waiter", 0)
	f.mustCount(t, ctx, "other", 1)
}
