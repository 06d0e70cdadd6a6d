package conformance_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
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

func (s *conflictOnceStore) Reserve(ctx context.Context, r idempotency.Reservation) (idempotency.Txn[*sql.Tx], *idempotency.Record, error) {
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

type conflictTxn struct{ idempotency.Txn[*sql.Tx] }

func (t conflictTxn) Complete(ctx context.Context, _ idempotency.Response) error {
	if err := t.Rollback(ctx); err != nil {
		return err
	}
	return fmt.Errorf("%w: injected: the transaction lost to another writer", idempotency.ErrConflict)
}

const heldAgainEnv = "CONFORMANCE_HELD_AGAIN"

// TestHeldAgainInner runs a waiting case on conflictOnceStore; only
// TestHolderRunsAgainFailsCleanly runs it.
func TestHeldAgainInner(t *testing.T) {
	if os.Getenv(heldAgainEnv) == "" {
		t.Skip("runs only inside TestHolderRunsAgainFailsCleanly")
	}
	conformance.Run(t, conformance.Harness[*sql.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*sql.Tx] {
			f := newFixture(t, opts)
			f.Store = &conflictOnceStore{KeyStore: f.Store, seen: map[idempotency.Key]bool{}}
			return f
		},
		Features: conformance.Features{SerialWriters: true},
	})
}

// TestHolderRunsAgainFailsCleanly: when the holder's transaction is rolled
// back under it and Do runs its fn again, the case fails, and the test
// binary does not panic (a panic would end the whole run and skip every
// t.Cleanup, leaving servers behind).
func TestHolderRunsAgainFailsCleanly(t *testing.T) {
	if os.Getenv(heldAgainEnv) != "" {
		t.Skip("inside the run")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestHeldAgainInner$/^WaiterGetsReplay$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), heldAgainEnv+"=1")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("did not finish within 50s:\n%s", out)
	}
	if strings.Contains(string(out), "panic:") {
		t.Fatalf("the case panicked, want it to fail:\n%s", out)
	}
	if err == nil || !strings.Contains(string(out), "--- FAIL: TestHeldAgainInner/WaiterGetsReplay ") ||
		!strings.Contains(string(out), "fn ran again after it held the key") {
		t.Fatalf("want WaiterGetsReplay to fail, naming the holder's second run (%v):\n%s", err, out)
	}
}
