package postgres_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/postgres"
)

// BenchmarkAlternating times the bare effect transaction, a new key and
// a replay one after the other in every iteration, on one connection, so
// that all three meet the same load of a shared machine, and reports the
// median of each ratio to the bare transaction of the same iteration
// (newkey-x, replay-x) and the median bare time (bare-µs):
//
//	go test -run '^$' -bench BenchmarkAlternating -benchtime 2000x ./postgres
func BenchmarkAlternating(b *testing.B) {
	for _, c := range []struct {
		name string
		cfg  postgres.Config
	}{
		{"Default", postgres.Config{}},
		{"LookupAlways", postgres.Config{Lookup: backend.LookupAlways}},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			f := newFixture(b, newPool(b, 1), c.cfg)
			g := f.guard(b, nil)
			resp := idempotency.Response{Status: 201, Body: []byte(`{"id":1}`)}
			fn := func(tx pgx.Tx) (idempotency.Response, error) { return resp, f.effect(ctx, tx, "alt") }
			var bare, newKey, replay []float64
			timed := func(op func() error) float64 {
				start := time.Now()
				if err := op(); err != nil {
					b.Fatal(err)
				}
				return float64(time.Since(start))
			}
			i := 0
			for b.Loop() {
				i++
				key := idempotency.Key{ID: "alt-" + strconv.Itoa(i)}
				do := func() error { _, err := g.Do(ctx, key, "fp", fn); return err }
				t0 := timed(func() error { return f.bare(ctx, "bare") })
				bare = append(bare, t0)
				newKey = append(newKey, timed(do)/t0)
				replay = append(replay, timed(do)/t0)
			}
			median := func(s []float64) float64 { slices.Sort(s); return s[len(s)/2] }
			b.ReportMetric(median(bare)/1e3, "bare-µs")
			b.ReportMetric(median(newKey), "newkey-x")
			b.ReportMetric(median(replay), "replay-x")
		})
	}
}
