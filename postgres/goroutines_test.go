package postgres_test

import (
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// TestNoGrowth: thousands of keys (new, replayed, failed) leave the number
// of goroutines and the live heap where they were.
func TestNoGrowth(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
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
		return testkit.Goroutines(), ms.HeapAlloc
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
	testkit.MustCount(t, ctx, f.count, "growth", (400+keys)*9/10)
}
