package mysql

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestWinnerFailsWhileOthersWait: 20 callers of one key, each with a Guard
// of its own (as 20 processes would be), so that 19 of them wait for the
// key in the database, in their INSERT (the lookup is a consistent read,
// which never waits). The winner's fn fails and rolls back only once the 19
// wait; InnoDB then grants the row to one waiter and answers most others
// with deadlocks (1213), which the store reports as ErrConflict and Do
// retries: one effect, 19 identical successes, one error (the winner's
// own), on every path and isolation level. The test insists that the
// deadlocks happened.
func TestWinnerFailsWhileOthersWait(t *testing.T) {
	for _, p := range paths {
		for _, iso := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelReadCommitted} {
			t.Run(p.name+"/"+strings.ReplaceAll(iso.String(), " ", ""), func(t *testing.T) {
				winnerFails(t, iso, p)
			})
		}
	}
}

func winnerFails(t *testing.T, iso sql.IsolationLevel, p path) {
	const callers = 20
	ctx := testkit.Context(t, 90*time.Second)
	db := openDB(t, testConfig(t, nil), callers+2)
	monitor := openDB(t, testConfig(t, nil), 1)
	f := newFixture(t, db, &Config{Isolation: iso})
	s := newStoreIso(t, db, f.table, p, iso)
	var retries atomic.Int64
	guards := make([]*idempotency.Guard[*sql.Tx], callers)
	for i := range guards {
		g, err := idempotency.New(s, &idempotency.Config{Observer: func(_ context.Context, ev idempotency.Event) {
			retries.Add(int64(ev.Attempts - 1))
		}})
		if err != nil {
			t.Fatal(err)
		}
		guards[i] = g
	}
	errBoom := errors.New("the winner's effect fails")
	key := idempotency.Key{Scope: "hard", ID: testkit.Name("idem_test_")}
	var calls atomic.Int64
	fn := func(tx *sql.Tx) (idempotency.Response, error) {
		n := calls.Add(1)
		if err := f.fx.Effect(ctx, tx, "payment"); err != nil {
			return idempotency.Response{}, err
		}
		if n > 1 {
			return idempotency.Response{Status: 201, Header: http.Header{"X-N": {fmt.Sprint(n)}}, Body: fmt.Appendf(nil, "execution %d", n)}, nil
		}
		// Fail only once the 19 others are waiting on the key's row.
		if err := waitForLockWaits(ctx, monitor, f.table, callers-1); err != nil {
			t.Errorf("the other callers never queued on the key: %v", err)
		}
		return idempotency.Response{}, errBoom
	}
	results := make([]struct {
		resp idempotency.Response
		err  error
	}, callers)
	testkit.Together(callers, func(i int) {
		results[i].resp, results[i].err = guards[i].Do(ctx, key, "fp", fn)
	})

	var first *idempotency.Response
	failed, executed := 0, 0
	for i, r := range results {
		switch {
		case errors.Is(r.err, errBoom):
			failed++
		case r.err != nil:
			t.Fatalf("caller %d: %v; only the failing winner may see an error", i, r.err)
		default:
			if !r.resp.Replayed {
				executed++
			}
			if first == nil {
				first = &results[i].resp
			} else if first.Status != r.resp.Status || !bytes.Equal(first.Body, r.resp.Body) || first.Header.Get("X-N") != r.resp.Header.Get("X-N") {
				t.Fatalf("caller %d got %d %q, others %d %q", i, r.resp.Status, r.resp.Body, first.Status, first.Body)
			}
		}
	}
	if failed != 1 || executed != 1 {
		t.Fatalf("got %d failed and %d executed, want 1 and 1", failed, executed)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("fn ran %d times, want 2 (the failing winner, then one waiter)", n)
	}
	testkit.MustCount(t, ctx, f.fx.Count, "payment", 1)
	t.Logf("%v: %d attempts were retried after ErrConflict", iso, retries.Load())
	if retries.Load() == 0 {
		t.Fatalf("no caller retried: the waiters were not answered with deadlocks, so the test did not exercise the hard case")
	}
}

// waitForLockWaits polls until want transactions wait for a lock in a
// statement on table.
func waitForLockWaits(ctx context.Context, monitor *sql.DB, table string, want int) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		var n int
		err := monitor.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.INNODB_TRX
WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE ?`, "%`"+table+"`%").Scan(&n)
		if err != nil {
			return err
		}
		if n >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			var all []string
			rows, err := monitor.QueryContext(context.Background(), "SELECT CONCAT(COMMAND, ' ', COALESCE(STATE, '')), COALESCE(INFO, 'NULL') FROM information_schema.PROCESSLIST")
			if err == nil {
				for rows.Next() {
					var a, b string
					_ = rows.Scan(&a, &b)
					all = append(all, a+": "+b)
				}
				rows.Close()
			}
			return fmt.Errorf("%d of %d waiting: %w; %q", n, want, ctx.Err(), all)
		case <-time.After(200 * time.Millisecond):
			// InnoDB refreshes INNODB_TRX only when it was not read in the
			// last 100ms: polling faster would freeze it.
		}
	}
}

// hold reserves key on s directly and returns its open Txn.
func hold(t *testing.T, ctx context.Context, s *Store, key idempotency.Key) idempotency.Txn[*sql.Tx] {
	t.Helper()
	txn, rec, err := s.Reserve(ctx, idempotency.Reservation{Key: key, Fingerprint: "fp", TTL: time.Hour, Wait: time.Second})
	if err != nil || txn == nil {
		t.Fatalf("hold %q: got %v, %v", key.ID, rec, err)
	}
	t.Cleanup(func() { _ = txn.Rollback(context.Background()) })
	return txn
}

// sessionState reads the lock wait timeout and connection id of the only
// connection of db.
func sessionState(t *testing.T, ctx context.Context, db *sql.DB) (wait, id int64) {
	t.Helper()
	if err := db.QueryRowContext(ctx, "SELECT @@SESSION.innodb_lock_wait_timeout, CONNECTION_ID()").Scan(&wait, &id); err != nil {
		t.Fatal(err)
	}
	return wait, id
}
