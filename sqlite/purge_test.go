package sqlite_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestExpiredTakeover: a live key is returned; at ExpiresAt it is taken
// over in the same statement, with the new fingerprint.
func TestExpiredTakeover(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	now := time.Unix(1_700_000_000, 1)
	var clock atomic.Pointer[time.Time]
	at := func(t time.Time) time.Time { clock.Store(&t); return t }
	f := openFixture(t, 1).clocked(t, func() time.Time { return *clock.Load() })
	key := idempotency.Key{ID: "k"}
	txn, _, err := f.store.Reserve(ctx, reservation(key, at(now), 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := txn.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("old")}); err != nil {
		t.Fatal(err)
	}
	r := reservation(key, at(now.Add(time.Hour-1)), 0)
	if _, rec, err := f.store.Reserve(ctx, r); err != nil || rec == nil || string(rec.Body) != "old" {
		t.Fatalf("1ns before expiry: %v, %v; want the record", rec, err)
	}
	r = reservation(key, at(now.Add(time.Hour)), 0)
	r.Fingerprint = "fp2"
	txn, rec, err := f.store.Reserve(ctx, r)
	if err != nil || txn == nil || rec != nil {
		t.Fatalf("at expiry: %v, %v, %v; want a txn", txn, rec, err)
	}
	// Rolled back: the old row comes back (expired, so still taken over).
	if err := txn.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var fp, state string
	if err := f.db.QueryRowContext(ctx, `SELECT fingerprint, state FROM "`+strings.TrimSuffix(f.effects, "_effects")+`" WHERE id = 'k'`).Scan(&fp, &state); err != nil || fp != "fp" || state != "completed" {
		t.Fatalf("after the rollback of a takeover: %q %q %v; want the old completed row", fp, state, err)
	}
}

func TestPurgeLimit(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	var clock atomic.Pointer[time.Time]
	at := func(t time.Time) time.Time { clock.Store(&t); return t }
	f := openFixture(t, 0).clocked(t, func() time.Time { return *clock.Load() })
	base := time.Unix(1_700_000_000, 0)
	for i := range 5 {
		// Completed at base - TTL + i ns: expires at base + i ns.
		r := reservation(idempotency.Key{ID: fmt.Sprint("old", i)}, at(base.Add(time.Duration(i)*time.Nanosecond-time.Hour)), 0)
		txn, _, err := f.store.Reserve(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if err := txn.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	at(base.Add(3 * time.Nanosecond)) // old0..old3 expired (<=), old4 not
	for _, want := range []int{2, 2, 0} {
		if n, err := f.store.Purge(ctx, 2); err != nil || n != want {
			t.Fatalf("Purge(limit 2): got %d, %v; want %d", n, err, want)
		}
	}
	if _, rec, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: "old4"}, at(base), 0)); err != nil || rec == nil {
		t.Fatalf("unexpired key after purge: %v, %v; want kept", rec, err)
	}
}
