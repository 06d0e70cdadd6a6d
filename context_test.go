package idempotency_test

import (
	"context"
	"testing"

	"github.com/go-idempotency/idempotency"
)

func TestWithTx(t *testing.T) {
	type tx struct{ n int }
	key := idempotency.Key{Scope: "s", ID: "k"}
	ctx := idempotency.WithTx(context.Background(), &tx{n: 1}, key)
	if got, ok := idempotency.TxFrom[*tx](ctx); !ok || got.n != 1 {
		t.Fatalf("TxFrom = %v, %v; want the tx", got, ok)
	}
	if got, ok := idempotency.KeyFrom(ctx); !ok || got != key {
		t.Fatalf("KeyFrom = %v, %v; want %v", got, ok, key)
	}
	if _, ok := idempotency.TxFrom[*tx](context.Background()); ok {
		t.Fatal("TxFrom without WithTx: ok")
	}
	if _, ok := idempotency.KeyFrom(context.Background()); ok {
		t.Fatal("KeyFrom without WithTx: ok")
	}
}

// TestTxFromWrongType: TxFrom asked for another type than the context's
// transaction panics with an error naming both types. It returned a
// nil transaction and false, which handlers written `tx, _ :=` used.
func TestTxFromWrongType(t *testing.T) {
	type tx struct{ n int }
	ctx := idempotency.WithTx(context.Background(), &tx{n: 1}, idempotency.Key{ID: "k"})
	defer func() {
		e, ok := recover().(error)
		if !ok || e.Error() != "idempotency: TxFrom[string] called on a context whose transaction is a *idempotency_test.tx (the Guard's Tx type): call TxFrom[*idempotency_test.tx]" {
			t.Fatalf("recovered %#v; want an error naming string and *idempotency_test.tx", e)
		}
	}()
	got, ok := idempotency.TxFrom[string](ctx)
	t.Fatalf("TxFrom of another type = %q, %v; want a panic", got, ok)
}

// TestTxFromInterface: a Guard whose Tx is an interface carries it as
// that interface; TxFrom of the interface finds it.
func TestTxFromInterface(t *testing.T) {
	type execer interface{ Exec() }
	ctx := idempotency.WithTx[execer](context.Background(), nil, idempotency.Key{ID: "k"})
	if got, ok := idempotency.TxFrom[execer](ctx); ok || got != nil {
		t.Fatalf("TxFrom of a nil tx = %v, %v; want nil, false", got, ok)
	}
}
