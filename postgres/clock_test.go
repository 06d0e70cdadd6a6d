package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// timeTracer records every statement and every argument of a time type
// the pool sends.
type timeTracer struct {
	statements atomic.Int64
	mu         sync.Mutex
	times      []string // "SQL: value" of each time argument
}

func (tr *timeTracer) args(sql string, args []any) {
	tr.statements.Add(1)
	for _, a := range args {
		switch v := a.(type) {
		case time.Time, *time.Time:
			tr.mu.Lock()
			tr.times = append(tr.times, fmt.Sprintf("%.40s: %v", sql, v))
			tr.mu.Unlock()
		}
	}
}

func (tr *timeTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.args(d.SQL, d.Args)
	return ctx
}
func (tr *timeTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (tr *timeTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (tr *timeTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	tr.args(d.SQL, d.Args)
}
func (tr *timeTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (tr *timeTracer) sent() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.times...)
}

// TestServerClockOnly is the filed report (two instances 2h apart, TTL
// 10min: a waiter ran fn again when the holder committed, and a purger
// ahead deleted a record completed 0.1s earlier) on the store's clock:
// with the default Config no statement carries a time of the application
// (every path: new key, replay, waiter, takeover of an expired row, Purge;
// under READ COMMITTED and SERIALIZABLE), so the instances' clocks cannot
// matter; a waiter on a second Store replays the holder's answer, one
// effect, and a Purge at once deletes nothing. A Store with Config.Clock
// does send it (the check can fail).
func TestServerClockOnly(t *testing.T) {
	for _, c := range []struct {
		name      string
		configure []func(*pgxpool.Config)
	}{
		{"ReadCommitted", nil},
		{"Serializable", []func(*pgxpool.Config){isolation("serializable")}},
		{"SimpleProtocol", []func(*pgxpool.Config){func(c *pgxpool.Config) {
			c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testkit.Context(t, testTimeout)
			tr := &timeTracer{}
			pool := newPool(t, 4, append(c.configure, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr })...)
			f := newFixture(t, pool, postgres.Config{})
			other, err := postgres.New(pool, &postgres.Config{Table: f.table})
			if err != nil {
				t.Fatal(err)
			}
			cfg := &idempotency.Config{TTL: 10 * time.Minute}
			holder, waiter := f.guard(t, cfg), f.guard(t, cfg)
			waiterOther, err := idempotency.New(other, cfg)
			if err != nil {
				t.Fatal(err)
			}
			_ = waiter
			key := idempotency.Key{ID: "skew"}
			fn := func(tx pgx.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 201, Body: []byte("paid")}, f.effect(ctx, tx, "pay")
			}
			held, release := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := holder.Do(ctx, key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
					close(held)
					<-release
					return fn(tx)
				})
				done <- err
			}()
			<-held
			type result struct {
				r   idempotency.Response
				err error
			}
			wdone := make(chan result, 1)
			go func() {
				r, err := waiterOther.Do(ctx, key, "fp", fn)
				wdone <- result{r, err}
			}()
			time.Sleep(300 * time.Millisecond) // the waiter waits on the key's lock
			close(release)
			if err := <-done; err != nil {
				t.Fatalf("holder: %v", err)
			}
			if w := <-wdone; w.err != nil || !w.r.Replayed || string(w.r.Body) != "paid" {
				t.Fatalf("waiter on another Store: %+v, %v; want the holder's answer replayed", w.r, w.err)
			}
			time.Sleep(100 * time.Millisecond)
			if n, err := waiterOther.Purge(ctx); err != nil || n != 0 {
				t.Fatalf("Purge 0.1s after the completion (TTL 10min): deleted %d, %v; want 0", n, err)
			}
			if r, err := waiter.Do(ctx, key, "fp", fn); err != nil || !r.Replayed {
				t.Fatalf("retry after Purge: %+v, %v; want replayed", r, err)
			}
			testkit.MustCount(t, ctx, f.count, "pay", 1)

			// An expired row, on the server's clock: taken over, then purged.
			short := f.guard(t, &idempotency.Config{TTL: time.Millisecond})
			exp := idempotency.Key{ID: "short"}
			for i := range 2 {
				if r, err := short.Do(ctx, exp, "fp", fn); err != nil || r.Replayed {
					t.Fatalf("TTL 1ms, call %d 20ms apart: %+v, %v; want executed", i, r, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if n, err := short.Purge(ctx); err != nil || n != 1 {
				t.Fatalf("Purge of the expired key: %d, %v; want 1", n, err)
			}
			if sent := tr.sent(); len(sent) != 0 || tr.statements.Load() == 0 {
				t.Fatalf("%d statements sent, %d with a time of the application, want none: %q", tr.statements.Load(), len(sent), sent)
			}

			// The control: a test clock is sent.
			clocked, err := postgres.New(pool, &postgres.Config{Table: f.table, Clock: time.Now})
			if err != nil {
				t.Fatal(err)
			}
			g, err := idempotency.New(clocked, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := g.Do(ctx, idempotency.Key{ID: "clocked"}, "fp", fn); err != nil {
				t.Fatal(err)
			}
			if len(tr.sent()) == 0 {
				t.Fatal("a Store with Config.Clock sent no time: the tracer sees nothing")
			}
		})
	}
}
