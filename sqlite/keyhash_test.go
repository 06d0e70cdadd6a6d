package sqlite_test

import (
	"path/filepath"
	"testing"

	"github.com/go-idempotency/idempotency/internal/keyleak"
	"github.com/go-idempotency/idempotency/sqlite"
)

// TestErrorsNameKeyHash: Do's errors on SQLite (a stored mismatch, a key
// held by the Store's writer, a closed database) name the key by its hash,
// never by its scope or id, and carry the raw key in an
// backend.KeyError.
func TestErrorsNameKeyHash(t *testing.T) {
	f := openFixture(t, 0)
	closed := openBare(t, filepath.Join(t.TempDir(), "closed.db"))
	broken, err := sqlite.New(closed, nil)
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	keyleak.Check(t, f.store, broken)
}
