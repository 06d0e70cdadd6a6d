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
	// Two rounds of keys: a leak grows both, where a background allocation
	// of the test binary (another test's pool closing, the runtime's own)
	// shows in one at most. A goroutine per key would add thousands, the
	// pool's own come and go by a few.
	const keys, slack = 2000, 4
	g0, h0 := measure()
	parallel(400, 400+keys)
	g1, h1 := measure()
	parallel(400+keys, 400+2*keys)
	g2, h2 := measure()
	t.Logf("goroutines %d -> %d -> %d, live heap %d -> %d -> %d bytes, over two rounds of %d keys", g0, g1, g2, h0, h1, h2, keys)
	if g1 > g0+slack && g2 > g1 {
		t.Errorf("goroutines grew from %d to %d to %d over two rounds of %d keys", g0, g1, g2, keys)
	}
	// 256 KiB a round of 2000 keys: a leak of 130 bytes per key would show.
	if h1 > h0+256<<10 && h2 > h1+256<<10 {
		t.Errorf("live heap grew from %d to %d to %d bytes over two rounds of %d keys", h0, h1, h2, keys)
	}
	testkit.MustCount(t, ctx, f.count, "growth", (400+2*keys)*9/10)
}
