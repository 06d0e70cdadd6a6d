package conformance

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/observe"
)

func (s *suite[Tx]) observer(t *testing.T) {
	e := s.setup(t, Options{})
	var mu sync.Mutex
	var events []observe.Event
	g := e.guard(&idempotency.Config{Observer: func(_ context.Context, ev observe.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	}})
	key := idempotency.Key{ID: uniq("k")}
	fn := e.effectFn("payment", new(atomic.Int64))
	_, _ = g.Do(e.ctx, key, "fp", fn)
	_, _ = g.Do(e.ctx, key, "fp", fn)
	_, _ = g.Do(e.ctx, key, "other", fn)
	_, _ = g.Do(e.ctx, idempotency.Key{ID: uniq("k")}, "fp", func(Tx) (idempotency.Response, error) {
		return idempotency.Response{}, errFnFails
	})
	want := []observe.Outcome{observe.Executed, observe.Replayed, observe.Mismatch, observe.HandlerError}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != len(want) {
		t.Fatalf("observer saw %d events, want %d", len(events), len(want))
	}
	for i, ev := range events {
		if ev.Outcome != want[i] || ev.Duration <= 0 {
			t.Fatalf("event %d: got %v (duration %v), want %v", i, ev.Outcome, ev.Duration, want[i])
		}
	}
	if !errors.Is(events[3].Err, errFnFails) || events[0].Key != key {
		t.Fatalf("events carry the key and the error: got %+v", events)
	}
}

func (s *suite[Tx]) noGoroutineGrowth(t *testing.T) {
	e := s.setup(t, Options{MaxConns: 2})
	g := e.guard(nil)
	round := func(i int) {
		key := idempotency.Key{ID: uniq("k")}
		if _, err := g.Do(e.ctx, key, "fp", e.effectFn("growth", new(atomic.Int64))); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if r, err := g.Do(e.ctx, key, "fp", e.effectFn("growth", new(atomic.Int64))); err != nil || !r.Replayed {
			t.Fatalf("replay %d: %+v, %v", i, r, err)
		}
		if _, err := g.Do(e.ctx, key, "other", e.effectFn("growth", new(atomic.Int64))); !errors.Is(err, idempotency.ErrMismatch) {
			t.Fatalf("mismatch %d: %v", i, err)
		}
		if _, err := g.Do(e.ctx, idempotency.Key{ID: uniq("k")}, "fp", func(Tx) (idempotency.Response, error) {
			return idempotency.Response{}, errFnFails
		}); !errors.Is(err, errFnFails) {
			t.Fatalf("failing fn %d: %v", i, err)
		}
	}
	for i := range 10 { // warm up the pool and the driver
		round(i)
	}
	settle := func() int {
		n := runtime.NumGoroutine()
		for range 20 {
			time.Sleep(25 * time.Millisecond)
			if m := runtime.NumGoroutine(); m <= n {
				n = m
			}
		}
		return n
	}
	before := settle()
	const rounds = 200
	for i := range rounds {
		round(i)
	}
	// Goroutines that end on their own (lease renewals, driver watchers)
	// get time to end; what is left grew with the number of keys.
	deadline := time.Now().Add(5 * time.Second)
	after := settle()
	for after > before+2 && time.Now().Before(deadline) {
		after = settle()
	}
	if after > before+2 {
		t.Fatalf("goroutines grew from %d to %d over %d keys: something started per call never ends", before, after, 2*rounds)
	}
	e.count("growth", 10+rounds, "one effect per new key")
}

func (s *suite[Tx]) migrateTwice(t *testing.T) {
	e := s.setup(t, Options{})
	m, ok := e.f.Store.(backend.Migrator)
	if !ok {
		t.Skip("the store does not implement backend.Migrator")
	}
	if m.Schema() == "" {
		t.Fatal("Schema() is empty")
	}
	g := e.guard(nil)
	key := idempotency.Key{ID: uniq("k")}
	resp := e.executes(g, key, "migrate", "before migrating again")
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- m.Migrate(e.ctx) }()
	}
	var merrs []error // reported here, not from within's goroutine
	within(t, 30*time.Second, "two Migrate at once", func() {
		for range 2 {
			if err := <-errs; err != nil {
				merrs = append(merrs, err)
			}
		}
	})
	for _, err := range merrs {
		t.Errorf("Migrate again, concurrently: %v", err)
	}
	if err := m.Migrate(e.ctx); err != nil {
		t.Fatalf("Migrate a third time: %v", err)
	}
	e.replays(e.guard(nil), key, resp, "a key completed before migrating again")
	e.executes(g, idempotency.Key{ID: uniq("k")}, "migrate", "a new key after migrating again")
	e.count("migrate", 2, "Migrate keeps the records")
}
