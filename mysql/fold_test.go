package mysql

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestCompleteRefusesGoneRow: when fn deletes the key's pending row
// through tx, Complete commits nothing (neither the effect nor a key), on
// every path: the folded completion refuses to COMMIT as the plain one
// does.
func TestCompleteRefusesGoneRow(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Context(t, 30*time.Second)
			db := openDB(t, testConfig(t, interpolate), 0)
			f := newFixture(t, db, nil)
			g, err := idempotency.New(newStore(t, db, f.table, p), nil)
			if err != nil {
				t.Fatal(err)
			}
			key := idempotency.Key{ID: testkit.Name("idem_test_")}
			_, err = g.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
				if err := f.fx.Effect(ctx, tx, "payment"); err != nil {
					return idempotency.Response{}, err
				}
				_, err := tx.ExecContext(ctx, "DELETE FROM `"+f.table+"` WHERE scope = ? AND id = ?", []byte(key.Scope), []byte(key.ID))
				return idempotency.Response{Status: 201}, err
			})
			if !errors.Is(err, idempotency.ErrStore) || !errors.Is(err, errPendingGone) {
				t.Fatalf("Do with fn deleting its key row: got %v, want a store error for the gone row", err)
			}
			testkit.MustCount(t, ctx, f.fx.Count, "payment", 0)
			var rows int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+f.table+"`").Scan(&rows); err != nil || rows != 0 {
				t.Fatalf("key rows: %d, %v; want none", rows, err)
			}
			if inUse := db.Stats().InUse; inUse != 0 {
				t.Fatalf("connections in use: %d", inUse)
			}
		})
	}
}

// TestFoldedCompleteTooLarge: a response too large for the driver to
// interpolate (over the DSN's maxAllowedPacket) is stored through a
// prepared UPDATE and a COMMIT of its own, byte-exact.
func TestFoldedCompleteTooLarge(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	cfg := testConfig(t, func(c *gomysql.Config) {
		c.InterpolateParams = true
		c.MaxAllowedPacket = 64 << 10
	})
	db := openDB(t, cfg, 0)
	f := newFixture(t, db, nil)
	g, err := idempotency.New(newStore(t, db, f.table, paths[0]), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte{0, '\'', '\\', 'x', 0xff}, 50_000) // 250 KB, escapes included
	key := idempotency.Key{ID: testkit.Name("idem_test_")}
	for round := range 2 {
		resp, err := g.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: body}, f.fx.Effect(ctx, tx, "big")
		})
		if err != nil || resp.Replayed != (round == 1) || !bytes.Equal(resp.Body, body) {
			t.Fatalf("round %d: replayed %v, %d bytes, %v", round, resp.Replayed, len(resp.Body), err)
		}
	}
	testkit.MustCount(t, ctx, f.fx.Count, "big", 1)
}

// TestCompleteCutLeavesNoTransaction cuts Complete's context at moments
// spread over its duration, on a pool of one connection, and checks after
// each cut that the session left in the pool has no open transaction and
// that the effect and the answer were committed together or not at all.
// The cuts come 50µs apart; on a host so loaded that all 40 of them fell
// inside Complete, later ones double their delay (up to 8 more) until one
// Complete ends before its cut.
func TestCompleteCutLeavesNoTransaction(t *testing.T) {
	for _, p := range paths[:2] {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Context(t, 60*time.Second)
			db := openDB(t, testConfig(t, interpolate), 1)
			f := newFixture(t, db, nil)
			s := newStore(t, db, f.table, p)
			cut, i := 0, 0
			for ; i < 40 || (cut == i && i < 48); i++ {
				key := idempotency.Key{ID: testkit.Name("idem_test_")}
				r := backend.Reservation{Key: key, Fingerprint: "fp", TTL: time.Hour}
				txn, _, err := s.Reserve(ctx, r)
				if err != nil || txn == nil {
					t.Fatalf("cut %d: reserve: %v", i, err)
				}
				if err := f.fx.Effect(ctx, txn.Tx(), key.ID); err != nil {
					t.Fatal(err)
				}
				cctx, cancel := context.WithCancel(ctx)
				delay := time.Duration(i) * 50 * time.Microsecond
				if i >= 40 {
					delay = 2 * time.Millisecond << (i - 40)
				}
				timer := time.AfterFunc(delay, cancel)
				cerr := txn.Complete(cctx, idempotency.Response{Status: 201, Body: []byte(key.ID)})
				timer.Stop()
				cancel()
				var inTx int
				if err := db.QueryRowContext(ctx, "SELECT @@in_transaction").Scan(&inTx); err != nil || inTx != 0 {
					t.Fatalf("cut %d (Complete: %v): the pooled session has in_transaction %d (%v), want 0", i, cerr, inTx, err)
				}
				// Wait for the cut transaction to end on the server, then
				// compare the answer with the effect.
				r.Wait = 10 * time.Second
				again, rec, err := s.Reserve(ctx, r)
				if err != nil {
					t.Fatalf("cut %d: reserve again: %v", i, err)
				}
				want := 0
				if rec != nil {
					want = 1
				} else if err := again.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
				if cerr != nil {
					cut++
				}
				if cerr == nil && want != 1 {
					t.Fatalf("cut %d: Complete succeeded but the key is free", i)
				}
				testkit.MustCount(t, ctx, f.fx.Count, key.ID, want)
			}
			t.Logf("%d of %d Completes cut", cut, i)
			if cut == 0 || cut == i {
				t.Fatalf("%d of %d Completes cut: the cuts missed Complete", cut, i)
			}
		})
	}
}

// TestIsolationApplied: fn's transaction runs at Config.Isolation on every
// path, the folded START TRANSACTION included, as InnoDB reports it.
func TestIsolationApplied(t *testing.T) {
	ctx := testkit.Context(t, 60*time.Second)
	db := openDB(t, testConfig(t, interpolate), 0)
	f := newFixture(t, db, nil)
	for _, p := range paths {
		for _, c := range []struct {
			iso  sql.IsolationLevel
			want string
		}{
			{sql.LevelReadCommitted, "READ COMMITTED"},
			{sql.LevelRepeatableRead, "REPEATABLE READ"},
			{sql.LevelSerializable, "SERIALIZABLE"},
		} {
			g, err := idempotency.New(newStoreIso(t, db, f.table, p, c.iso), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := g.Do(ctx, idempotency.Key{ID: testkit.Name("idem_test_")}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
				// InnoDB refreshes INNODB_TRX when it was last read more than
				// 100ms ago: wait so that the transaction is in it.
				time.Sleep(150 * time.Millisecond)
				var level string
				err := tx.QueryRowContext(ctx, `SELECT trx_isolation_level FROM information_schema.INNODB_TRX
WHERE trx_mysql_thread_id = CONNECTION_ID()`).Scan(&level)
				return idempotency.Response{Status: 200, Body: []byte(level)}, err
			})
			if err != nil || string(resp.Body) != c.want {
				t.Errorf("%s, %v: fn's transaction at %q (%v), want %q", p.name, c.iso, resp.Body, err, c.want)
			}
		}
	}
}
