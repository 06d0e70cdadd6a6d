package conformance_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// conflictOnceStore wraps a correct store: the first Complete of each key
// rolls the transaction back and reports a retryable conflict, as a Galera
// node does when another node completed the key first. Do then runs fn a
// second time, which a case's holder must not do.
type conflictOnceStore struct {
	idempotency.KeyStore[*sql.Tx]
	mu   sync.Mutex
	seen map[idempotency.Key]bool
}

func (s *conflictOnceStore) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*sql.Tx], *backend.Record, error) {
	txn, rec, err := s.KeyStore.Reserve(ctx, r)
	if txn == nil {
		return txn, rec, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[r.Key] {
		return txn, rec, err
	}
	s.seen[r.Key] = true
	return conflictTxn{txn}, rec, err
}

type conflictTxn struct{ backend.Txn[*sql.Tx] }

func (t conflictTxn) Complete(ctx context.Context, _ idempotency.Response) error {
	if err := t.Rollback(ctx); err != nil {
		return err
	}
	return fmt.Errorf("%w: injected: the transaction lost to another writer", backend.ErrConflict)
}
