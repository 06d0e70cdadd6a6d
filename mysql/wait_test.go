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

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/observe"
)

// TestWaitBoundRestored checks that the reservation's lock wait bound maps
// a held key to ErrInProgress and never leaks into fn or into the pooled
// session.
func TestWaitBoundRestored(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			waitBoundRestored(t, p)
		})
	}
}

func waitBoundRestored(t *testing.T, p path) {
	ctx := testkit.Context(t, 60*time.Second)
	cfg := testConfig(t, nil)
	f := newFixture(t, openDB(t, cfg, 0), nil)
	db := openDB(t, cfg, 1) // one connection: the session is observable
	s := newStore(t, db, f.table, p)
	if _, err := db.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 9"); err != nil {
		t.Fatal(err)
	}
	_, conn := sessionState(t, ctx, db)
	check := func(what string) {
		t.Helper()
		wait, id := sessionState(t, ctx, db)
		if wait != 9 || id != conn {
			t.Fatalf("%s: session %d has innodb_lock_wait_timeout %d, want session %d with 9", what, id, wait, conn)
		}
		var saved sql.NullInt64
		if err := db.QueryRowContext(ctx, "SELECT @idempotency_lock_wait").Scan(&saved); err != nil || saved.Valid {
			t.Fatalf("%s: @idempotency_lock_wait is %v (%v), want NULL", what, saved, err)
		}
	}

	key := idempotency.Key{ID: testkit.Name("idem_test_")}
	holder := hold(t, ctx, f.store, key)
	for _, wait := range []time.Duration{0, 300 * time.Millisecond, 1500 * time.Millisecond} {
		start := time.Now()
		_, _, err := s.Reserve(ctx, backend.Reservation{Key: key, Fingerprint: "fp", TTL: time.Hour, Wait: wait})
		if !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("Wait %v on a held key: got %v, want ErrInProgress", wait, err)
		}
		t.Logf("Wait %v: ErrInProgress after %v", wait, time.Since(start).Round(time.Millisecond))
		check(fmt.Sprintf("after Wait %v", wait))
	}

	// A waiter that gets the record restores the session too.
	done := make(chan error, 1)
	go func() {
		_, rec, err := s.Reserve(ctx, backend.Reservation{Key: key, Fingerprint: "fp", TTL: time.Hour, Wait: 20 * time.Second})
		if err == nil && (rec == nil || string(rec.Body) != "held") {
			err = fmt.Errorf("got record %+v, want the holder's", rec)
		}
		done <- err
	}()
	if err := waitForLockWaits(ctx, openDB(t, cfg, 1), f.table, 1); err != nil {
		t.Fatal(err)
	}
	if err := holder.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("held")}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	check("after a waiter got the record")

	// fn runs with the session's own setting.
	g, err := idempotency.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.Do(ctx, idempotency.Key{ID: testkit.Name("idem_test_")}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
		var wait int64
		if err := tx.QueryRowContext(ctx, "SELECT @@SESSION.innodb_lock_wait_timeout").Scan(&wait); err != nil {
			return idempotency.Response{}, err
		}
		if wait != 9 {
			return idempotency.Response{}, fmt.Errorf("fn sees innodb_lock_wait_timeout %d, want the session's 9", wait)
		}
		return idempotency.Response{Status: 200}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	check("after Do")
}

// TestCancelWhileWaiting cancels a Reserve waiting for a held key on a pool
// of one connection: it returns promptly with the context's error, and the
// pool stays usable.
func TestCancelWhileWaiting(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			cancelWhileWaiting(t, p)
		})
	}
}

func cancelWhileWaiting(t *testing.T, p path) {
	ctx := testkit.Context(t, 60*time.Second)
	cfg := testConfig(t, nil)
	f := newFixture(t, openDB(t, cfg, 0), nil)
	db := openDB(t, cfg, 1)
	s := newStore(t, db, f.table, p)
	key := idempotency.Key{ID: testkit.Name("idem_test_")}
	holder := hold(t, ctx, f.store, key)

	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	_, _, err := s.Reserve(cctx, backend.Reservation{Key: key, Fingerprint: "fp", TTL: time.Hour, Wait: 30 * time.Second})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while waiting: got %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("returned %v after the cancel", d)
	}
	// The pool of one is usable at once, while the key is still held.
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	defer pcancel()
	if err := db.PingContext(pctx); err != nil {
		t.Fatalf("pool after a cancelled wait: %v", err)
	}
	if inUse := db.Stats().InUse; inUse != 0 {
		t.Fatalf("connections in use after the cancelled Reserve: %d", inUse)
	}
	if err := holder.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("held")}); err != nil {
		t.Fatal(err)
	}
	_, rec, err := s.Reserve(ctx, backend.Reservation{Key: key, Fingerprint: "fp", TTL: time.Hour, Wait: time.Second})
	if err != nil || rec == nil || string(rec.Body) != "held" {
		t.Fatalf("after the holder completed: got %+v, %v", rec, err)
	}
}

// TestWaiterSeesCommitUnderRepeatableRead: a waiter that started its
// transaction (or its lookup) before the holder committed reads the
// committed record, not its snapshot; on every path.
func TestWaiterSeesCommitUnderRepeatableRead(t *testing.T) {
	for _, p := range paths {
		for _, iso := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable, sql.LevelReadCommitted} {
			t.Run(p.name+"/"+strings.ReplaceAll(iso.String(), " ", ""), func(t *testing.T) {
				t.Parallel()
				ctx := testkit.Context(t, 60*time.Second)
				cfg := testConfig(t, nil)
				db := openDB(t, cfg, 0)
				f := newFixture(t, db, &Config{Isolation: iso})
				s := newStoreIso(t, db, f.table, p, iso)
				key := idempotency.Key{ID: testkit.Name("idem_test_")}
				holder := hold(t, ctx, f.store, key)
				done := make(chan *backend.Record, 1)
				go func() {
					_, rec, err := s.Reserve(ctx, backend.Reservation{Key: key, Fingerprint: "fp", TTL: time.Hour, Wait: 20 * time.Second})
					if err != nil {
						t.Errorf("waiter: %v", err)
					}
					done <- rec
				}()
				if err := waitForLockWaits(ctx, openDB(t, cfg, 1), f.table, 1); err != nil {
					t.Fatal(err)
				}
				want := idempotency.Response{Status: 202, Header: http.Header{"A": {"b"}}, Body: []byte("committed")}
				if err := holder.Complete(ctx, want); err != nil {
					t.Fatal(err)
				}
				rec := <-done
				if rec == nil || rec.Status != 202 || string(rec.Body) != "committed" || rec.Header.Get("A") != "b" || rec.Fingerprint != "fp" {
					t.Fatalf("waiter: got %+v, want the committed record", rec)
				}
			})
		}
	}
}

// TestWaiterTakesReleasedKey: a caller waiting for a held key (in its
// INSERT) takes the key when its holder
// rolls back, within its wait bound; on every path.
func TestWaiterTakesReleasedKey(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Context(t, 60*time.Second)
			cfg := testConfig(t, nil)
			db := openDB(t, cfg, 0)
			f := newFixture(t, db, nil)
			s := newStore(t, db, f.table, p)
			key := idempotency.Key{ID: testkit.Name("idem_test_")}
			holder := hold(t, ctx, f.store, key)
			type result struct {
				txn backend.Txn[*sql.Tx]
				rec *backend.Record
				err error
			}
			done := make(chan result, 1)
			go func() {
				txn, rec, err := s.Reserve(ctx, backend.Reservation{Key: key, Fingerprint: "fp2", TTL: time.Hour, Wait: 20 * time.Second})
				done <- result{txn, rec, err}
			}()
			if err := waitForLockWaits(ctx, openDB(t, cfg, 1), f.table, 1); err != nil {
				t.Fatal(err)
			}
			if err := holder.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || r.txn == nil {
				t.Fatalf("waiter after the holder rolled back: got %v, %+v, %v; want the key", r.txn, r.rec, r.err)
			}
			if err := f.fx.Effect(ctx, r.txn.Tx(), "payment"); err != nil {
				t.Fatal(err)
			}
			if err := r.txn.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("second")}); err != nil {
				t.Fatal(err)
			}
			testkit.MustCount(t, ctx, f.fx.Count, "payment", 1)
			_, rec, err := s.Reserve(ctx, backend.Reservation{Key: key, Fingerprint: "fp", TTL: time.Hour, Wait: time.Second})
			if err != nil || rec == nil || rec.Fingerprint != "fp2" || string(rec.Body) != "second" {
				t.Fatalf("after the waiter completed: got %+v, %v", rec, err)
			}
		})
	}
}

// TestLockNearTheKeyIsNotInProgress: a first try whose INSERT is refused
// by a lock near the key, not on it (here a locking read of the absent key
// by another transaction, which takes the gap; a purge deleting the rows
// next to the key does the same), is a passing conflict that Do retries,
// not a key in progress: even a NoWait caller gets its effect once the
// lock is gone. A key really held still gives ErrInProgress at once.
func TestLockNearTheKeyIsNotInProgress(t *testing.T) {
	for _, p := range []path{paths[0], paths[1], paths[4], {name: "Default", dialect: dialectMariaDB}} {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Context(t, 60*time.Second)
			db := openDB(t, testConfig(t, func(c *gomysql.Config) { c.InterpolateParams = true }), 0)
			f := newFixture(t, db, nil)
			s := newStore(t, db, f.table, p)
			g, err := idempotency.New(s, &idempotency.Config{WaitTimeout: -1, RetryBackoff: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			key := idempotency.Key{ID: testkit.Name("near_")}
			fn := func(tx *sql.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 201, Body: []byte("ok")}, f.fx.Effect(ctx, tx, "near")
			}

			// Another transaction reads the absent key with a lock (REPEATABLE
			// READ: it locks the gap where the key would go).
			other, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = other.Rollback() }()
			rows, err := other.QueryContext(ctx, "SELECT id FROM `"+f.table+"` WHERE scope = '' AND id = ? FOR UPDATE", key.ID)
			if err != nil {
				t.Fatal(err)
			}
			_ = rows.Close()
			// The gap lock refuses an INSERT of the key that does not wait.
			probe, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = probe.ExecContext(ctx, "SET STATEMENT innodb_lock_wait_timeout=0 FOR INSERT INTO `"+f.table+
				"` (scope, id, fingerprint, state, status, created_at, expires_at) VALUES ('', ?, 'x', 'pending', 0, 0, 1)", key.ID)
			_ = probe.Rollback()
			if !errors.Is(mapError(ctx, err, true, ""), idempotency.ErrInProgress) {
				t.Fatalf("an INSERT into the locked gap: %v, want a lock wait timeout (the test needs one)", err)
			}

			released := make(chan struct{})
			time.AfterFunc(100*time.Millisecond, func() { _ = other.Rollback(); close(released) })
			resp, err := g.Do(ctx, key, "fp", fn)
			if err != nil || resp.Replayed || resp.Status != 201 {
				t.Fatalf("Do with a lock near the key: %+v, %v; want the effect once the lock is gone", resp, err)
			}
			<-released
			if n, err := f.fx.Count(ctx, "near"); err != nil || n != 1 {
				t.Fatalf("effects: %d, %v; want 1", n, err)
			}

			// A key really held: ErrInProgress at once.
			held := idempotency.Key{ID: testkit.Name("held_")}
			holder := hold(t, ctx, newStore(t, openDB(t, testConfig(t, nil), 0), f.table, paths[0]), held)
			defer func() { _ = holder.Rollback(ctx) }()
			if _, err := g.Do(ctx, held, "fp", fn); !errors.Is(err, idempotency.ErrInProgress) {
				t.Fatalf("Do on a held key with NoWait: %v, want ErrInProgress", err)
			}
		})
	}
}

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
				// Whether InnoDB answers the waiters with deadlocks when the
				// winner rolls back depends on the order it grants the
				// row's lock in: the scenario runs again (its guarantees
				// checked each time) until it did, up to 5 times.
				const tries = 5
				for try := 1; ; try++ {
					if winnerFails(t, iso, p) > 0 {
						return
					}
					if try == tries {
						t.Fatalf("no caller retried in %d runs: the waiters were never answered with deadlocks, so the test did not exercise the hard case", tries)
					}
				}
			})
		}
	}
}

// winnerFails runs the scenario once, checks its guarantees, and returns
// how many attempts were retried after ErrConflict (the deadlocks).
func winnerFails(t *testing.T, iso sql.IsolationLevel, p path) int64 {
	const callers = 20
	ctx := testkit.Context(t, 90*time.Second)
	db := openDB(t, testConfig(t, nil), callers+2)
	monitor := openDB(t, testConfig(t, nil), 1)
	f := newFixture(t, db, &Config{Isolation: iso})
	s := newStoreIso(t, db, f.table, p, iso)
	var retries atomic.Int64
	guards := make([]*idempotency.Guard[*sql.Tx], callers)
	for i := range guards {
		g, err := idempotency.New(s, &idempotency.Config{Observer: func(_ context.Context, ev observe.Event) {
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
	return retries.Load()
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
func hold(t *testing.T, ctx context.Context, s *Store, key idempotency.Key) backend.Txn[*sql.Tx] {
	t.Helper()
	txn, rec, err := s.Reserve(ctx, backend.Reservation{Key: key, Fingerprint: "fp", TTL: time.Hour, Wait: time.Second})
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
