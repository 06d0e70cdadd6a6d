package historycheck

import (
	"context"
	"database/sql"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// forgetfulStore is a broken store, the catalogue's "blind-reserve" mistake
// made plain: every other Reserve that finds the key completed deletes it
// and takes it as new, so fn runs again: a duplicate effect and a changed
// answer for one key.
type forgetfulStore struct {
	idempotency.KeyStore[*sql.Tx]
	n atomic.Int64
}

func (s *forgetfulStore) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*sql.Tx], *backend.Record, error) {
	txn, rec, err := s.KeyStore.Reserve(ctx, r)
	if rec != nil && s.n.Add(1)%2 == 0 {
		if _, ferr := s.KeyStore.(backend.KeyAdmin).Forget(ctx, r.Key); ferr == nil {
			return s.KeyStore.Reserve(ctx, r)
		}
	}
	return txn, rec, err
}

// staleStore is a broken store that replays an answer it changed: the
// body of every other replay comes from an older copy of the record, with
// its last byte lost.
type staleStore struct {
	idempotency.KeyStore[*sql.Tx]
	n atomic.Int64
}

func (s *staleStore) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*sql.Tx], *backend.Record, error) {
	txn, rec, err := s.KeyStore.Reserve(ctx, r)
	if rec != nil && len(rec.Body) > 0 && s.n.Add(1)%2 == 0 {
		rec.Body = rec.Body[:len(rec.Body)-1]
	}
	return txn, rec, err
}

// TestBrokenStoresCaught feeds the checker histories recorded on two
// broken stores over SQLite: one that runs fn again on a completed key (a
// duplicate effect, a second answer), one that replays a changed answer.
// Each is caught, naming the keys, while the same histories on the correct
// store pass (TestHistories/sqlite).
func TestBrokenStoresCaught(t *testing.T) {
	for _, c := range []struct {
		name string
		wrap func(any) any
		says string
	}{
		{"forgets-completed-keys", func(s any) any { return &forgetfulStore{KeyStore: s.(idempotency.KeyStore[*sql.Tx])} }, "(replayed false)"},
		{"replays-a-changed-answer", func(s any) any { return &staleStore{KeyStore: s.(idempotency.KeyStore[*sql.Tx])} }, "(replayed true)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			recs, closeAll, err := Lanes(ctx, "sqlite", 2, c.wrap)
			if err != nil {
				t.Fatal(err)
			}
			defer closeAll()
			sum, err := Run(ctx, recs, 1, 20, 10*time.Second, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %v", c.name, sum)
			if len(sum.Violations) == 0 {
				t.Fatalf("the checker passed %d histories of a broken store", sum.Histories)
			}
			if !strings.Contains(sum.Violations[0], c.says) {
				t.Fatalf("the violation does not show the call that broke the rule (%q):\n%s", c.says, sum.Violations[0])
			}
			t.Logf("the first violation:\n%s", sum.Violations[0])
		})
	}
}
