package idempotency

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/backend"
)

// mayBeHeldStore reports, on every first try (Wait == 0), a conflict that
// may be the key's (ErrInProgress and ErrConflict both, as the mysql store
// does on a Galera cluster), and hands out the key on a waiting try, or on
// a first try from the readyAt-th Reserve on (0: never).
type mayBeHeldStore struct {
	fakeStore
	mu      sync.Mutex
	tries   []time.Duration // r.Wait of each Reserve
	readyAt int
}

func (s *mayBeHeldStore) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[int], *backend.Record, error) {
	s.mu.Lock()
	s.tries = append(s.tries, r.Wait)
	ready := s.readyAt > 0 && len(s.tries) >= s.readyAt
	s.mu.Unlock()
	if r.Wait == 0 && !ready {
		return nil, nil, fmt.Errorf("%w: may be held: %w", ErrInProgress, fmt.Errorf("%w: 1213", backend.ErrConflict))
	}
	return fakeTxn{&s.fakeStore}, nil, nil
}

// TestConflictMayBeHeld: a first try that reports a conflict that may be
// the key's leads to the waiting try at once; with no waiter slot left it
// is retried as a conflict (a near lock, not the key: no reason to give
// up with ErrInProgress), and the call gets the key once the conflict
// passes.
func TestConflictMayBeHeld(t *testing.T) {
	s := &mayBeHeldStore{}
	g := mustNew(t, s, &Config{WaitTimeout: 10 * time.Second})
	if _, err := g.Do(context.Background(), Key{ID: "k"}, "fp", answer200); err != nil || len(s.tries) != 2 || s.tries[1] <= 0 {
		t.Fatalf("%v after tries with waits %v; want the key from the waiting try, the second", err, s.tries)
	}

	s = &mayBeHeldStore{readyAt: 4}
	g = mustNew(t, s, &Config{WaitTimeout: 10 * time.Second, RetryBackoff: time.Microsecond})
	for g.takeWaiter() { // every waiter slot taken
	}
	_, err := g.Do(context.Background(), Key{ID: "k"}, "fp", answer200)
	if err != nil || len(s.tries) != 4 {
		t.Fatalf("no waiter slot: %v after %d tries; want the key once the conflict passed", err, len(s.tries))
	}
	for _, w := range s.tries {
		if w != 0 {
			t.Fatalf("no waiter slot, yet a waiting try: %v", s.tries)
		}
	}
}
