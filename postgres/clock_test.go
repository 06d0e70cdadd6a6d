package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// timeTracer passes every statement the pool sends, and its arguments, to
// a testkit.ClockArgs.
type timeTracer struct{ testkit.ClockArgs }

func (tr *timeTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.See(d.SQL, d.Args...)
	return ctx
}
func (tr *timeTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (tr *timeTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (tr *timeTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	tr.See(d.SQL, d.Args...)
}
func (tr *timeTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestServerClockOnly is the filed report (two instances 2h apart, TTL
// 10min: a waiter ran fn again when the holder committed, and a purger
// ahead deleted a record completed 0.1s earlier) on the store's clock:
// with the default Config no statement carries a time of the application
// (every path: new key, replay, waiter, takeover of an expired row, Purge;
// under READ COMMITTED and SERIALIZABLE), so the instances' clocks cannot
// matter (testkit.ClockOnly).
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
			store := func(cfg *postgres.Config) idempotency.KeyStore[pgx.Tx] {
				s, err := postgres.New(pool, cfg)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			testkit.ClockOnly(t, ctx, testkit.ClockOnlyCase[pgx.Tx]{
				Store:   f.store,
				Other:   store(&postgres.Config{Table: f.table}),
				Clocked: func() idempotency.KeyStore[pgx.Tx] { return store(&postgres.Config{Table: f.table, Clock: time.Now}) },
				Effect:  f.effect,
				Count:   f.count,
				Sent:    tr.Sent,
			})
		})
	}
}
