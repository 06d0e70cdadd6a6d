package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/memstore"
	"github.com/go-idempotency/idempotency/observe"
)

func newGuard(t *testing.T, s *memstore.Store, cfg *idempotency.Config) *idempotency.Guard[*memstore.Tx] {
	t.Helper()
	g, err := idempotency.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func ok(tag string) func(*memstore.Tx) (idempotency.Response, error) {
	return func(tx *memstore.Tx) (idempotency.Response, error) {
		tx.Effect(tag)
		return idempotency.Response{Status: 201, Body: []byte(tag)}, nil
	}
}

func TestConflictsAreRetried(t *testing.T) {
	s := memstore.New()
	var n atomic.Int64
	s.ReserveErr = func() error {
		if n.Add(1) <= 3 {
			return fmt.Errorf("%w: deadlock (1213)", backend.ErrConflict)
		}
		return nil
	}
	var attempts int
	g := newGuard(t, s, &idempotency.Config{Observer: func(_ context.Context, ev observe.Event) { attempts = ev.Attempts }})
	resp, err := g.Do(context.Background(), idempotency.Key{ID: "k"}, "fp", ok("pay"))
	if err != nil || resp.Replayed || string(resp.Body) != "pay" {
		t.Fatalf("got %+v, %v; want executed after 3 conflicts", resp, err)
	}
	if attempts != 4 || s.Count("pay") != 1 {
		t.Fatalf("attempts %d, effects %d; want 4 and 1", attempts, s.Count("pay"))
	}
}

func TestConflictRetriesAreBounded(t *testing.T) {
	s := memstore.New()
	var n atomic.Int64
	s.ReserveErr = func() error {
		n.Add(1)
		return fmt.Errorf("%w: serialization failure (40001)", backend.ErrConflict)
	}
	g := newGuard(t, s, &idempotency.Config{MaxRetries: 2, RetryBackoff: time.Microsecond})
	_, err := g.Do(context.Background(), idempotency.Key{ID: "k"}, "fp", ok("pay"))
	if !errors.Is(err, backend.ErrConflict) || n.Load() != 3 {
		t.Fatalf("got %v after %d reservations; want backend.ErrConflict after 3", err, n.Load())
	}
	if s.Count("pay") != 0 {
		t.Fatal("fn ran without a reservation")
	}
}

func TestFailsClosed(t *testing.T) {
	s := memstore.New()
	down := errors.New("dial tcp 127.0.0.1:5432: connection refused")
	s.ReserveErr = func() error { return down }
	g := newGuard(t, s, nil)
	ran := false
	_, err := g.Do(context.Background(), idempotency.Key{ID: "k"}, "fp", func(*memstore.Tx) (idempotency.Response, error) {
		ran = true
		return idempotency.Response{Status: 200}, nil
	})
	if !errors.Is(err, down) || ran {
		t.Fatalf("store down: got %v, fn ran %v; want the store's error and fn not run", err, ran)
	}
}

func TestCancelledContextDoesNotRun(t *testing.T) {
	g := newGuard(t, memstore.New(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	_, err := g.Do(ctx, idempotency.Key{ID: "k"}, "fp", func(*memstore.Tx) (idempotency.Response, error) {
		ran = true
		return idempotency.Response{Status: 200}, nil
	})
	if !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("got %v, ran %v; want context.Canceled and fn not run", err, ran)
	}
}

func TestObserverSeesPanic(t *testing.T) {
	var ev observe.Event
	g := newGuard(t, memstore.New(), &idempotency.Config{Observer: func(_ context.Context, e observe.Event) { ev = e }})
	func() {
		defer func() { _ = recover() }()
		_, _ = g.Do(context.Background(), idempotency.Key{ID: "k"}, "fp", func(*memstore.Tx) (idempotency.Response, error) { panic("boom") })
	}()
	if ev.Outcome != observe.HandlerError || ev.Err == nil {
		t.Fatalf("observer after a panic: got %+v, want HandlerError with an error", ev)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	if _, err := idempotency.New[*memstore.Tx](nil, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("nil store: got %v", err)
	}
	if _, err := idempotency.New(memstore.New(), &idempotency.Config{TTL: time.Microsecond}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("1µs TTL: got %v", err)
	}
}

func TestOutcomeString(t *testing.T) {
	for o, want := range map[observe.Outcome]string{observe.Executed: "executed", observe.Replayed: "replayed",
		observe.Mismatch: "mismatch", observe.InProgress: "in_progress",
		observe.NotStored: "not_stored", observe.HandlerError: "handler_error", observe.Rejected: "rejected",
		observe.StoreError: "store_error", observe.Canceled: "canceled", observe.Internal: "internal",
		0: "Outcome(0)", 99: "Outcome(99)"} {
		if o.String() != want {
			t.Errorf("%d: got %q, want %q", int(o), o.String(), want)
		}
	}
}

var errDeadlock = errors.New("ERROR: deadlock detected (SQLSTATE 40P01)")

func TestConflictInFnIsRetried(t *testing.T) {
	s := memstore.New()
	s.Conflict = func(err error) bool { return errors.Is(err, errDeadlock) }
	g := newGuard(t, s, nil)
	var calls int
	resp, err := g.Do(context.Background(), idempotency.Key{ID: "k"}, "fp", func(tx *memstore.Tx) (idempotency.Response, error) {
		calls++
		tx.Effect("pay")
		if calls < 3 {
			return idempotency.Response{}, errDeadlock
		}
		return idempotency.Response{Status: 201}, nil
	})
	if err != nil || resp.Status != 201 || calls != 3 || s.Count("pay") != 1 {
		t.Fatalf("got %+v, %v after %d calls, %d effects; want 201 after 3 calls and 1 effect", resp, err, calls, s.Count("pay"))
	}
	// Other errors from fn are not retried, and come back as they are.
	calls = 0
	other := errors.New("card declined")
	_, err = g.Do(context.Background(), idempotency.Key{ID: "k2"}, "fp", func(*memstore.Tx) (idempotency.Response, error) {
		calls++
		return idempotency.Response{}, other
	})
	if err != other || calls != 1 {
		t.Fatalf("got %v after %d calls; want fn's own error after 1 call", err, calls)
	}
}
