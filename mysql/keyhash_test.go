package mysql

import (
	"testing"

	"github.com/go-idempotency/idempotency/internal/keyleak"
)

// TestErrorsNameKeyHash: Do's errors on MySQL (a stored mismatch, a key
// held by an open reservation, a closed database) name the key by its
// hash, never by its scope or id, and carry the raw key in an
// backend.KeyError.
func TestErrorsNameKeyHash(t *testing.T) {
	f := newFixture(t, openDB(t, testConfig(t, nil), 0), nil)
	closed := openDB(t, testConfig(t, nil), 0)
	broken, err := New(closed, &Config{Table: f.table})
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	keyleak.Check(t, f.store, broken)
}
