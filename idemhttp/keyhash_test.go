package idemhttp_test

import (
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
)

// TestEventKeyHash: an Event names its key by the hash of scope and id,
// and by nothing when the request had no valid key.
func TestEventKeyHash(t *testing.T) {
	key := idempotency.Key{Scope: "tenant-secret-7", ID: "order-42-secret"}
	if got := (idemhttp.RequestEvent{Key: key}).KeyHash(); got != key.Hash() || got == "" {
		t.Errorf("KeyHash() = %q, want %q", got, key.Hash())
	}
	if got := (idemhttp.RequestEvent{Key: idempotency.Key{Scope: "s"}}).KeyHash(); got != "" {
		t.Errorf("KeyHash() of an event without a key = %q, want \"\"", got)
	}
}
