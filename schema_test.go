package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/memstore"
	"github.com/go-idempotency/idempotency/observe"
)

// errNoTable is what a store returns for its missing table: ErrSchema with
// the driver's error.
var errNoTable = fmt.Errorf("%w: memstore: table %q does not exist: run Migrate or apply Schema: %w",
	idempotency.ErrSchema, "keys", errors.New("no such table: keys"))

// TestSchemaErrorIsNotStoreError: a missing table is a configuration
// error. Do, Run and Admit return it as the store gave it, never wrapped in
// ErrStore ("retrying with the same key is safe"); fn never runs, nothing
// is retried, and the event's outcome is Failed.
func TestSchemaErrorIsNotStoreError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := memstore.New()
	reserves := 0
	s.ReserveErr = func() error { reserves++; return errNoTable }
	var events []observe.Event
	g := newGuard(t, s, &idempotency.Config{Observer: func(_ context.Context, ev observe.Event) { events = append(events, ev) }})
	key := idempotency.Key{ID: "k"}

	ran := false
	_, err := g.Do(ctx, key, "fp", func(*memstore.Tx) (idempotency.Response, error) {
		ran = true
		return idempotency.Response{Status: 200}, nil
	})
	checkSchemaErr(t, "Do", err)
	if ran || reserves != 1 {
		t.Fatalf("Do: fn ran %v after %d reservations; want not run after 1", ran, reserves)
	}
	if len(events) != 1 || events[0].Outcome != observe.Internal || !errors.Is(events[0].Err, idempotency.ErrSchema) {
		t.Fatalf("Do's events: %+v; want one Failed with ErrSchema", events)
	}

	op := &idempotency.Operation[*memstore.Tx]{
		Name: "op",
		Steps: []idempotency.Step[*memstore.Tx]{{Name: "one", Local: func(context.Context, *memstore.Tx, *idempotency.State) error {
			ran = true
			return nil
		}}},
		Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
			ran = true
			return idempotency.Response{Status: 200}, nil
		},
	}
	_, err = g.Run(ctx, key, "fp", []byte("in"), op)
	checkSchemaErr(t, "Run", err)
	if ran {
		t.Fatal("Run: a step ran on a store without its table")
	}
	if len(events) != 2 || events[1].Outcome != observe.Internal {
		t.Fatalf("Run's events: %+v; want a second one, Internal", events)
	}
}

// checkSchemaErr fails t unless err wraps ErrSchema and the store's error,
// and not ErrStore.
func checkSchemaErr(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, idempotency.ErrSchema) || !errors.Is(err, errNoTable) {
		t.Fatalf("%s: got %v; want ErrSchema and the store's error", what, err)
	}
	if errors.Is(err, idempotency.ErrStore) || strings.Contains(err.Error(), "retrying with the same key is safe") {
		t.Fatalf("%s: got %v; a schema error must not say a retry is safe (ErrStore)", what, err)
	}
}

// TestCheckSchema: Guard.CheckSchema asks the store's SchemaChecker with the
// caller's SchemaCheck, returns its ErrSchema as it is and wraps any other
// failure in ErrStore; a store without a SchemaChecker passes.
func TestCheckSchema(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := memstore.New()
	g := newGuard(t, s, nil)
	if err := g.CheckSchema(ctx, idempotency.SchemaCheck{Quota: true}); err != nil {
		t.Fatalf("memstore without SchemaErr: %v", err)
	}
	var asked []backend.SchemaCheck
	s.SchemaErr = func(c backend.SchemaCheck) error {
		asked = append(asked, c)
		if c.Quota {
			return errNoTable
		}
		return nil
	}
	if err := g.CheckSchema(ctx, idempotency.SchemaCheck{}); err != nil {
		t.Fatalf("keys only: %v", err)
	}
	err := g.CheckSchema(ctx, idempotency.SchemaCheck{Quota: true})
	checkSchemaErr(t, "CheckSchema", err)
	if len(asked) != 2 || asked[0].Quota || !asked[1].Quota {
		t.Fatalf("the store was asked %+v; want {false} then {true}", asked)
	}
	down := errors.New("dial tcp: connection refused")
	s.SchemaErr = func(backend.SchemaCheck) error { return down }
	if err := g.CheckSchema(ctx, idempotency.SchemaCheck{}); !errors.Is(err, idempotency.ErrStore) || !errors.Is(err, down) {
		t.Fatalf("store down: got %v; want ErrStore and the store's error", err)
	}

	plain, err := idempotency.New[*memstore.Tx](noSchema{s}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.CheckSchema(ctx, idempotency.SchemaCheck{Quota: true}); err != nil {
		t.Fatalf("a store without SchemaChecker: %v; want nil", err)
	}
}

// noSchema is a store that does not implement SchemaChecker.
type noSchema struct {
	idempotency.KeyStore[*memstore.Tx]
}
