package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/sqlite"
)

// TestNoWaitReplaysTogether: callers with NoWait that replay one completed
// key at the same time all get the replay, none ErrInProgress, although
// each finds another caller looking the key up.
func TestNoWaitReplaysTogether(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 0)
	g := guard(t, f.store, &idempotency.Config{WaitTimeout: -1})
	key := idempotency.Key{ID: testkit.Name("k_")}
	if _, err := g.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 200, Body: []byte("ok")}, f.fx.Effect(ctx, tx, "x")
	}); err != nil {
		t.Fatal(err)
	}
	for round := range 20 {
		const n = 20
		errs := make(chan error, n)
		testkit.Together(n, func(int) {
			r, err := g.Do(ctx, key, "fp", func(*sql.Tx) (idempotency.Response, error) {
				return idempotency.Response{}, errors.New("fn must not run for a completed key")
			})
			if err == nil && (!r.Replayed || string(r.Body) != "ok") {
				err = errors.New("not the stored response: " + string(r.Body))
			}
			errs <- err
		})
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: NoWait replay of a completed key: %v", round, err)
			}
		}
	}
}

// TestExternalWriterBound: a write transaction outside the Store (another
// process, or code that writes without the Store) holds SQLite's write
// lock. A reservation with a wait bound, or a first try with the call's
// Deadline, waits for it under that bound, not under the connection's busy
// timeout (5s with Open, 70ms, none), then reports the key in progress
// (the writer may hold it); one without either waits under that busy
// timeout; one with NoWait does not wait, and reports the key in progress.
// Each leaves that busy timeout as it was.
func TestExternalWriterBound(t *testing.T) {
	for _, c := range []struct {
		name string
		open func(t *testing.T) *fixture
	}{
		{"Open", func(t *testing.T) *fixture { return openFixture(t, 0) }},
		{"NoOptions", func(t *testing.T) *fixture {
			return newFixture(t, openBare(t, filepath.Join(t.TempDir(), "bare.db")+"?_pragma=journal_mode(WAL)"), 0)
		}},
		{"ShortBusyTimeout", func(t *testing.T) *fixture { // shorter than the bounds: waits in several attempts
			return newFixture(t, openBare(t, filepath.Join(t.TempDir(), "short.db")+"?_pragma=busy_timeout(70)&_pragma=journal_mode(WAL)&_txlock=immediate"), 0)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testkit.Context(t, testTimeout)
			f := c.open(t)
			var bt0 int
			if err := f.db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&bt0); err != nil {
				t.Fatal(err)
			}
			ext, err := f.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ext.Rollback()
			if err := f.fx.Effect(ctx, ext, "external"); err != nil { // takes the write lock
				t.Fatal(err)
			}
			busy := time.Duration(bt0) * time.Millisecond
			for _, c := range []struct {
				name        string
				wait        time.Duration
				deadline    time.Duration // the call's Deadline, from now; 0: none
				noWait      bool
				want        error
				least, most time.Duration
			}{
				// No wait bound: the connection's own busy timeout bounds
				// the wait, then a busy database, a conflict to retry.
				{"Wait0", 0, 0, false, backend.ErrConflict, busy, busy + 2*time.Second},
				// A wait bound: up to it, whatever the busy timeout.
				{"Wait300ms", 300 * time.Millisecond, 0, false, idempotency.ErrInProgress, 300 * time.Millisecond, 300*time.Millisecond + 2*time.Second},
				// A first try of a call whose bound ends in 300ms: up to
				// it too, then the key may be held (the writer outside
				// may hold it).
				{"Wait0Deadline300ms", 0, 300 * time.Millisecond, false, idempotency.ErrInProgress, 300 * time.Millisecond, 300*time.Millisecond + 2*time.Second},
				// NoWait: at once, and the key may be held.
				{"NoWait", 0, 0, true, idempotency.ErrInProgress, 0, 2 * time.Second},
			} {
				r := reservation(idempotency.Key{ID: "k"}, time.Now(), c.wait)
				r.NoWait = c.noWait
				if c.deadline > 0 {
					r.Deadline = time.Now().Add(c.deadline)
				}
				start := time.Now()
				_, _, err := f.store.Reserve(ctx, r)
				took := time.Since(start)
				if !errors.Is(err, c.want) {
					t.Fatalf("%s while an external writer holds the lock: got %v, want %v", c.name, err, c.want)
				}
				if c.want != idempotency.ErrInProgress && errors.Is(err, idempotency.ErrInProgress) ||
					c.want == idempotency.ErrStore && errors.Is(err, backend.ErrConflict) {
					t.Fatalf("%s: got %v; want %v alone", c.name, err, c.want)
				}
				if took < c.least || took > c.most {
					t.Fatalf("%s: returned after %v, want %v..%v", c.name, took, c.least, c.most)
				}
			}
			time.AfterFunc(200*time.Millisecond, func() { _ = ext.Commit() })
			txn, _, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: "k"}, time.Now(), 10*time.Second))
			if err != nil || txn == nil {
				t.Fatalf("after the external writer commits: %v", err)
			}
			if err := txn.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
				t.Fatal(err)
			}
			for range 3 { // every pooled connection kept its busy timeout
				var bt int
				if err := f.db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&bt); err != nil || bt != bt0 {
					t.Fatalf("busy_timeout: got %d, %v; want %d", bt, err, bt0)
				}
			}
		})
	}
}

// TestPurgeWaitsForWriteTurn: Purge queues behind a held key like any
// writer of the Store, gives up when its ctx ends, and runs once the key is
// released.
func TestPurgeWaitsForWriteTurn(t *testing.T) {
	var clock atomic.Pointer[time.Time]
	now := time.Now()
	clock.Store(&now)
	f := openFixture(t, 0).clocked(t, func() time.Time { return *clock.Load() })
	release := hold(t, f, idempotency.Key{ID: "held"})
	ctx, cancel := context.WithTimeout(testkit.Context(t, testTimeout), 200*time.Millisecond)
	defer cancel()
	if _, err := f.store.Purge(ctx, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Purge while a key is held, ctx ending: got %v, want DeadlineExceeded", err)
	}
	release()
	later := now.Add(2 * time.Hour) // the held key, completed now, has expired
	clock.Store(&later)
	if n, err := f.store.Purge(testkit.Context(t, testTimeout), 10); err != nil || n != 1 {
		t.Fatalf("Purge after the release: %d, %v; want 1", n, err)
	}
}

// TestClose: Close releases the prepared statements; a reservation made
// before still completes, and Reserve afterwards fails.
func TestClose(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 0)
	txn, _, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: "k"}, time.Now(), 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.store.Close(); err != nil {
		t.Fatal(err)
	}
	if err := txn.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
		t.Fatalf("Complete after Close: %v", err)
	}
	if _, _, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: "k2"}, time.Now(), 0)); err == nil {
		t.Fatal("Reserve after Close: got nil, want an error")
	}
	var state string
	if err := f.db.QueryRowContext(ctx, `SELECT state FROM "`+f.table+`" WHERE id = 'k'`).Scan(&state); err != nil || state != "completed" {
		t.Fatalf("key completed across Close: %q, %v", state, err)
	}
	s2, err := sqlite.New(f.db, &sqlite.Config{Table: f.table})
	if err != nil {
		t.Fatal(err)
	}
	if _, rec, err := s2.Reserve(ctx, reservation(idempotency.Key{ID: "k"}, time.Now(), 0)); err != nil || rec == nil {
		t.Fatalf("another Store on the table: %v, %v; want the record", rec, err)
	}
}

// TestCommittedPendingRow: a live pending row that a writer outside this
// package committed is a key held by someone else (ErrInProgress), with or
// without a wait, and the connection keeps its busy timeout.
func TestCommittedPendingRow(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 1)
	now := time.Now()
	if _, err := f.db.ExecContext(ctx, `INSERT INTO "`+f.table+`" (scope, id, fingerprint, state, created_at, expires_at) VALUES ('', 'k', 'fp', 'pending', ?, ?)`,
		now.UnixNano(), now.Add(time.Hour).UnixNano()); err != nil {
		t.Fatal(err)
	}
	for _, wait := range []time.Duration{0, time.Second} {
		if _, _, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: "k"}, now, wait)); !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("wait %v on a committed pending row: got %v, want ErrInProgress", wait, err)
		}
		var bt int
		if err := f.db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&bt); err != nil || bt != 5000 {
			t.Fatalf("wait %v: busy_timeout after: %d, %v; want 5000", wait, bt, err)
		}
	}
}
