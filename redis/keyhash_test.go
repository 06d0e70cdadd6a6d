package redis

import (
	"testing"

	"github.com/go-idempotency/idempotency/internal/keyleak"
)

// TestErrorsNameKeyHash: Do's errors on Redis (a stored mismatch, a key
// held by a live reservation, a closed client) name the key by its hash,
// never by its scope or id, and carry the raw key in an
// backend.KeyError.
func TestErrorsNameKeyHash(t *testing.T) {
	f := newFixture(t, singleClient(t), 0, nil)
	closed := singleClient(t)(1)
	broken, err := New(closed, &Config{Prefix: f.prefix})
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	keyleak.Check(t, f.store, broken)
}
