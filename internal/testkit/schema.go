package testkit

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency"
)

// SchemaBroken checks g, a Guard whose store's table is missing or lacks a
// column (never migrated, an old schema): Do, and Run when runs is set,
// fail with [idempotency.ErrSchema], never [idempotency.ErrStore] (whose
// "retrying is safe" would send the caller the wrong way), without running
// fn or a step, and their errors say to migrate. CheckSchema, asked for
// the keys table only, fails the same way naming table. names lists what
// else each error must contain (the table, a column).
func SchemaBroken[Tx any](t testing.TB, ctx context.Context, g *idempotency.Guard[Tx], table string, runs bool, names ...string) {
	t.Helper()
	ran := false
	_, err := g.Do(ctx, idempotency.Key{ID: Name("schema_")}, "fp", func(Tx) (idempotency.Response, error) {
		ran = true
		return idempotency.Response{Status: 201}, nil
	})
	SchemaErr(t, "Do", err, append([]string{"Migrate"}, names...)...)
	if runs {
		op := &idempotency.Operation[Tx]{
			Name: "schema",
			Steps: []idempotency.Step[Tx]{{Name: "one", Local: func(context.Context, Tx, *idempotency.State) error {
				ran = true
				return nil
			}}},
			Finish: func(context.Context, Tx, *idempotency.State) (idempotency.Response, error) {
				ran = true
				return idempotency.Response{Status: 201}, nil
			},
		}
		_, err = g.Run(ctx, idempotency.Key{ID: Name("schema_")}, "fp", []byte("input"), op)
		SchemaErr(t, "Run", err, append([]string{"Migrate"}, names...)...)
	}
	if ran {
		t.Fatal("fn or a step ran on a store whose schema is broken")
	}
	err = g.CheckSchema(ctx, idempotency.SchemaCheck{})
	SchemaErr(t, "CheckSchema", err, append([]string{table, "Migrate", "Schema"}, names...)...)
}

// SchemaErr fails t unless err wraps [idempotency.ErrSchema], not
// [idempotency.ErrStore], and its text contains each of want.
func SchemaErr(t testing.TB, what string, err error, want ...string) {
	t.Helper()
	if !errors.Is(err, idempotency.ErrSchema) {
		t.Fatalf("%s: got %v; want an error wrapping ErrSchema", what, err)
	}
	if errors.Is(err, idempotency.ErrStore) || strings.Contains(err.Error(), "retrying with the same key is safe") {
		t.Fatalf("%s: got %v; a schema error must not wrap ErrStore (retrying is safe)", what, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s: %v; want it to name %q", what, err, w)
		}
	}
}
