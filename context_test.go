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
	if _, ok := idempotency.TxFrom[string](ctx); ok {
		t.Fatal("TxFrom of another type: ok")
	}
	if _, ok := idempotency.TxFrom[*tx](context.Background()); ok {
		t.Fatal("TxFrom without WithTx: ok")
	}
	if _, ok := idempotency.KeyFrom(context.Background()); ok {
		t.Fatal("KeyFrom without WithTx: ok")
	}
}
