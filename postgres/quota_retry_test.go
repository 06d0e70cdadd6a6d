package postgres_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// TestAdmitRetriesConflicts: 20 admissions of one scope at once under
// SERIALIZABLE meet serialization failures; Guard.AdmitQuota retries them, as Do
// retries a conflict, so every one is admitted and counted once, where
// most of them failed with ErrStore and ErrConflict.
func TestAdmitRetriesConflicts(t *testing.T) {
	pool := newPool(t, 24, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable" })
	f := newFixture(t, pool, postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}})
	g := f.guard(t, &idempotency.Config{MaxRetries: 50})
	ctx := testkit.Context(t, testTimeout)
	q := &idempotency.Quota{Window: time.Minute, MaxKeys: 100}
	start := make(chan struct{})
	errs := make([]error, 20)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			<-start
			adm, err := g.AdmitQuota(ctx, idempotency.Key{Scope: "acct", ID: fmt.Sprintf("k%d", i)}, q)
			if err == nil && !adm.Counted {
				err = fmt.Errorf("admitted without being counted: %+v", adm)
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("admission %d: %v", i, err)
		}
	}
	adm, err := g.AdmitQuota(ctx, idempotency.Key{Scope: "acct", ID: "k-last"}, &idempotency.Quota{Window: time.Minute, MaxKeys: 21})
	if err != nil || !adm.Counted {
		t.Fatalf("the 21st admission: %+v, %v", adm, err)
	}
	if _, err := g.AdmitQuota(ctx, idempotency.Key{Scope: "acct", ID: "k-over"}, &idempotency.Quota{Window: time.Minute, MaxKeys: 21}); err == nil {
		t.Fatal("the 22nd admission under MaxKeys 21 was admitted: the racing admissions were not each counted once")
	}
}
