package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

type callerKey struct{}

// tracer counts statements and round trips, and catches a caller that asks
// the pool for a connection while it holds one (callers are told apart by a
// callerKey value in their context).
type tracer struct {
	queries *atomic.Int64 // statements sent outside batches
	batches atomic.Int64

	mu        sync.Mutex
	owner     map[*pgx.Conn]int
	held      map[int]int
	violation string
}

func (tr *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if tr.queries != nil {
		tr.queries.Add(1)
	}
	return ctx
}

func (tr *tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	tr.batches.Add(1)
	return ctx
}

func (tr *tracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (tr *tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (tr *tracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	id, _ := ctx.Value(callerKey{}).(int)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if id != 0 && tr.held[id] > 0 && tr.violation == "" {
		tr.violation = fmt.Sprintf("caller %d asked the pool for a connection while holding %d", id, tr.held[id])
	}
	return ctx
}

func (tr *tracer) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	if data.Err != nil {
		return
	}
	id, _ := ctx.Value(callerKey{}).(int)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.owner == nil {
		tr.owner, tr.held = map[*pgx.Conn]int{}, map[int]int{}
	}
	tr.owner[data.Conn] = id
	tr.held[id]++
}

func (tr *tracer) TraceRelease(_ *pgxpool.Pool, data pgxpool.TraceReleaseData) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if id, ok := tr.owner[data.Conn]; ok {
		delete(tr.owner, data.Conn)
		tr.held[id]--
	}
}

func (tr *tracer) check(t testing.TB) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.violation != "" {
		t.Fatal(tr.violation)
	}
}

// TestOneConnection runs every path of Do on a pool of ONE connection: a
// call that asked for a second connection while holding the first would
// hang (bounded by the context) and is caught by the tracer.
func TestOneConnection(t *testing.T) {
	tr := &tracer{}
	pool := newPool(t, 1, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr })
	now := time.Now()
	f := newFixture(t, pool, postgres.Config{Clock: func() time.Time { return now }})
	g := f.guard(t, &idempotency.Config{TTL: time.Hour})
	ctx := context.WithValue(testkit.Context(t, testTimeout), callerKey{}, 1)
	call := func(fp string, fail bool) (idempotency.Response, error) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return g.Do(cctx, idempotency.Key{ID: "k"}, fp, func(tx pgx.Tx) (idempotency.Response, error) {
			if err := f.effect(cctx, tx, "one"); err != nil {
				return idempotency.Response{}, err
			}
			if fail {
				return idempotency.Response{}, errors.New("fn fails")
			}
			return idempotency.Response{Status: 201}, nil
		})
	}
	steps := []struct {
		name         string
		fp           string
		fail         bool
		wantErr      bool
		wantReplayed bool
	}{
		{"fn fails", "fp", true, true, false},
		{"new key", "fp", false, false, false},
		{"replay", "fp", false, false, true},
		{"mismatch", "other", false, true, false},
	}
	for _, s := range steps {
		r, err := call(s.fp, s.fail)
		if (err != nil) != s.wantErr || r.Replayed != s.wantReplayed {
			t.Fatalf("%s: got %+v, %v", s.name, r, err)
		}
		tr.check(t)
	}
	now = now.Add(2 * time.Hour) // expired: taken over
	if r, err := call("fp", false); err != nil || r.Replayed {
		t.Fatalf("expired key: got %+v, %v; want executed", r, err)
	}
	now = now.Add(2 * time.Hour)
	if n, err := f.store.Purge(ctx, 10); err != nil || n != 1 {
		t.Fatalf("Purge: got %d, %v; want 1", n, err)
	}
	tr.check(t)
	testkit.MustCount(t, ctx, f.count, "one", 2)
}

// TestRoundTrips counts the round trips of Do on a warm connection, the
// effect's own statement counted as one. By default a new key costs as many
// as the bare effect transaction (BEGIN with the lock and the look-up, the
// effect, the key row with COMMIT: 3), a replay 2 (the first round trip,
// then ROLLBACK), and a caller that waited for a key another Guard held 4
// (the first try and its ROLLBACK; the wait, its look-up and ROLLBACK).
// LookupAlways adds a plain look-up before each: a replay costs 1;
// LookupNever, on this history, costs what the default does. Under
// SERIALIZABLE the key is reserved by a pending row written in the first
// round trip and completed with COMMIT: 3 for a new key too.
func TestRoundTrips(t *testing.T) {
	for _, c := range []struct {
		name                            string
		cfg                             postgres.Config
		wantNew, wantReplay, wantWaiter int64
	}{
		{"Default", postgres.Config{}, 3, 2, 4},
		{"LookupAlways", postgres.Config{Lookup: backend.LookupAlways}, 4, 1, 6},
		{"LookupNever", postgres.Config{Lookup: backend.LookupNever}, 3, 2, 4},
		{"Serializable", postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}, 3, 2, 6},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testkit.Context(t, testTimeout)
			var queries atomic.Int64
			tr := &tracer{queries: &queries}
			pool := newPool(t, 1, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr })
			f := newFixture(t, pool, c.cfg)
			g := f.guard(t, nil)
			fn := func(tx pgx.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 201, Header: http.Header{"A": {"b"}}, Body: []byte("x")}, f.effect(ctx, tx, "rt")
			}
			trips := func(do func()) int64 {
				q, b := queries.Load(), tr.batches.Load()
				do()
				return queries.Load() - q + tr.batches.Load() - b
			}
			// Warm the connection's statement cache (the first use of a
			// statement on a connection costs one more round trip to
			// prepare it), the waiting path's included.
			// waitFor makes waiter wait for id, held by a caller of
			// another pool, until that caller completed.
			waitFor := func(waiter *idempotency.Guard[pgx.Tx], id string) {
				hf := *f
				other := c.cfg
				other.Table = f.table
				store, err := postgres.New(newPool(t, 2), &other)
				if err != nil {
					t.Fatal(err)
				}
				hf.store = store
				h := startHolder(t, ctx, hf.guard(t, nil), &hf, idempotency.Key{ID: id}, 1)
				done := make(chan struct{})
				go func() {
					defer close(done)
					if r, err := waiter.Do(ctx, idempotency.Key{ID: id}, "fp", fn); err != nil || !r.Replayed {
						t.Errorf("waiter: %+v, %v", r, err)
					}
				}()
				waitBlocked(t, ctx, pool)
				h.release.Open()
				if err := <-h.done; err != nil {
					t.Fatal(err)
				}
				<-done
			}
			for _, id := range []string{"warm", "warm"} {
				if _, err := g.Do(ctx, idempotency.Key{ID: id}, "fp", fn); err != nil {
					t.Fatal(err)
				}
			}
			// The waiting path's statements, on another store of the same
			// pool: a store's choice of look-up depends on its own history.
			other, err := postgres.New(pool, &postgres.Config{Table: f.table, Lookup: c.cfg.Lookup, TxOptions: c.cfg.TxOptions})
			if err != nil {
				t.Fatal(err)
			}
			of := *f
			of.store = other
			waitFor(of.guard(t, nil), "warm-waiter")
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
			waiter := trips(func() { waitFor(g, "waiter") })
			bare := trips(func() {
				if err := f.bare(ctx, "bare"); err != nil {
					t.Fatal(err)
				}
			})
			t.Logf("round trips: new key %d, replay %d, waiter %d, bare effect transaction %d", newKey, replay, waiter, bare)
			if newKey != c.wantNew || replay != c.wantReplay || waiter != c.wantWaiter || bare != 3 {
				t.Fatalf("round trips: new key %d, want %d (one of them the effect); replay %d, want %d; waiter %d, want %d; bare %d, want 3",
					newKey, c.wantNew, replay, c.wantReplay, waiter, c.wantWaiter, bare)
			}
		})
	}
}

// TestRoundTripsFollowTheLoad: with the default Config.Lookup the store looks
// a key up first only while most of its recent first tries were replays,
// so that a stream of replays costs 1 round trip each and a stream of new
// keys 3 each; a change of stream costs at most a few calls at the other
// price.
func TestRoundTripsFollowTheLoad(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	var queries atomic.Int64
	tr := &tracer{queries: &queries}
	pool := newPool(t, 1, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr })
	f := newFixture(t, pool, postgres.Config{})
	fn := func(tx pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201, Body: []byte("x")}, f.effect(ctx, tx, "rt")
	}
	// Warm the connection's statement cache on two other stores of the
	// same table, one of each way.
	for _, lookup := range []backend.LookupPolicy{backend.LookupNever, backend.LookupAlways} {
		warm, err := postgres.New(pool, &postgres.Config{Table: f.table, Lookup: lookup})
		if err != nil {
			t.Fatal(err)
		}
		wf := *f
		wf.store = warm
		g := wf.guard(t, nil)
		for _, id := range []string{"warm", "warm"} {
			if _, err := g.Do(ctx, idempotency.Key{ID: id + lookup.String()}, "fp", fn); err != nil {
				t.Fatal(err)
			}
		}
	}
	g := f.guard(t, nil)
	steps := []struct {
		id       string
		replayed bool
		want     int64
	}{
		{"a", false, 3}, {"a", true, 2}, {"a", true, 2}, // no look-up first yet
		{"a", true, 1}, {"a", true, 1}, // replays dominate: looked up first
		{"b", false, 4}, {"c", false, 4}, {"d", false, 4}, // new keys pay the look-up...
		{"e", false, 3}, {"f", false, 3}, // ...until they dominate
	}
	for i, s := range steps {
		q, b := queries.Load(), tr.batches.Load()
		r, err := g.Do(ctx, idempotency.Key{ID: s.id}, "fp", fn)
		got := queries.Load() - q + tr.batches.Load() - b
		if err != nil || r.Replayed != s.replayed || got != s.want {
			t.Fatalf("call %d (key %q): got %+v, %v in %d round trips; want replayed %v in %d", i, s.id, r, err, got, s.replayed, s.want)
		}
	}
}
