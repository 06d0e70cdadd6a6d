package postgres_test

import (
	"testing"

	"github.com/go-idempotency/idempotency/internal/keyleak"
	"github.com/go-idempotency/idempotency/postgres"
)

// TestErrorsNameKeyHash: Do's errors on PostgreSQL (a stored mismatch, a
// key held by an open reservation, a closed pool) name the key by its
// hash, never by its scope or id, and carry the raw key in an
// backend.KeyError.
func TestErrorsNameKeyHash(t *testing.T) {
	f := newFixture(t, newPool(t, 4), postgres.Config{})
	closed := newPool(t, 1)
	broken, err := postgres.New(closed, &postgres.Config{Table: f.table})
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	keyleak.Check(t, f.store, broken)
}
