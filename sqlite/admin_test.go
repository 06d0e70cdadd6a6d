package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/sqlite"
)

// completeKey reserves key at the clock's reading at and completes it
// with status 200, header and body.
func completeKey(t testing.TB, ctx context.Context, s *sqlite.Store, clock *testClock, at time.Time, key idempotency.Key, header map[string][]string, body []byte) {
	t.Helper()
	if clock != nil {
		clock.set(at)
	}
	txn, rec, err := s.Reserve(ctx, reservation(key, at, 0))
	if err != nil || txn == nil {
		t.Fatalf("Reserve %v: %v, %v", key, rec, err)
	}
	if err := txn.Complete(ctx, idempotency.Response{Status: 200, Header: header, Body: body}); err != nil {
		t.Fatal(err)
	}
}

// inspect calls Inspect and fails t on an error.
func inspect(t testing.TB, ctx context.Context, s *sqlite.Store, id string, body bool) *backend.KeyInfo {
	t.Helper()
	info, err := s.Inspect(ctx, idempotency.Key{ID: id}, body)
	if err != nil {
		t.Fatalf("Inspect %q: %v", id, err)
	}
	return info
}

// sameInfo fails t unless got is want, field by field.
func sameInfo(t testing.TB, what string, got *backend.KeyInfo, want backend.KeyInfo) {
	t.Helper()
	if !reflect.DeepEqual(*got, want) {
		t.Fatalf("%s:\n got %+v\nwant %+v", what, *got, want)
	}
}

// TestInspect: every state with its fields exact; the body only when
// asked, its length always (nil and empty bodies apart); a key held by an
// open transaction of this Store is KeyInProgress; one held by another Store's
// is not visible (ErrNotFound for a new key), and Inspect does not wait
// for it.
func TestInspect(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	clock := newTestClock(base)
	f := openFixture(t, 0).clocked(t, clock.now)
	header := map[string][]string{"X-A": {"1", "2"}}
	completeKey(t, ctx, f.store, clock, base, idempotency.Key{ID: "done"}, header, []byte{0, 1, 0xff})
	completeKey(t, ctx, f.store, clock, base, idempotency.Key{ID: "empty"}, nil, []byte{})
	completeKey(t, ctx, f.store, clock, base, idempotency.Key{ID: "nil"}, nil, nil)
	done := backend.KeyInfo{Key: idempotency.Key{ID: "done"}, State: backend.KeyCompleted, Fingerprint: "fp", Status: 200,
		Header: header, BodyLen: 3, CreatedAt: base, ExpiresAt: base.Add(time.Hour)}
	sameInfo(t, "completed, no body", inspect(t, ctx, f.store, "done", false), done)
	withBody := done
	withBody.Body = []byte{0, 1, 0xff}
	sameInfo(t, "completed, body", inspect(t, ctx, f.store, "done", true), withBody)
	if b := inspect(t, ctx, f.store, "empty", true).Body; b == nil || len(b) != 0 {
		t.Fatalf("empty body: %#v; want empty non-nil", b)
	}
	if i := inspect(t, ctx, f.store, "nil", true); i.Body != nil || i.BodyLen != 0 {
		t.Fatalf("nil body: %#v, %d; want nil, 0", i.Body, i.BodyLen)
	}
	clock.set(base.Add(time.Hour))
	expired := done
	expired.State = backend.KeyExpired
	sameInfo(t, "expired", inspect(t, ctx, f.store, "done", false), expired)

	savedKey(t, ctx, f, clock, base, "op", "A", []byte{9, 0})
	held := backend.KeyInfo{Key: idempotency.Key{ID: "op"}, State: backend.KeyInProgress, Fingerprint: "fp", CreatedAt: base,
		ExpiresAt: backend.MaxExpiry(), Progress: []byte{9, 0}, LeaseEnds: base.Add(testLease)}
	clock.set(base.Add(testLease - 1))
	sameInfo(t, "live lease", inspect(t, ctx, f.store, "op", false), held)
	clock.set(base.Add(testLease))
	unfinished := held
	unfinished.State = backend.KeyUnfinished
	sameInfo(t, "lease ended", inspect(t, ctx, f.store, "op", true), unfinished)
	p := mustAcquire(t, ctx, f.store, acquisition("op", "B", 0))
	sameInfo(t, "a phase of this Store open", inspect(t, ctx, f.store, "op", false), held) // as committed, but held
	if err := p.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	sameInfo(t, "after the phase's Rollback", inspect(t, ctx, f.store, "op", false), unfinished)

	release := hold(t, f, idempotency.Key{ID: "new"})
	sameInfo(t, "new key reserved by this Store", inspect(t, ctx, f.store, "new", false),
		backend.KeyInfo{Key: idempotency.Key{ID: "new"}, State: backend.KeyInProgress})
	release()

	other := stores(t, ctx, f, 2)[1]
	txn, _, err := other.Reserve(ctx, reservation(idempotency.Key{ID: "elsewhere"}, base, 0))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := f.store.Inspect(ctx, idempotency.Key{ID: "elsewhere"}, false); !errors.Is(err, idempotency.ErrNotFound) || time.Since(start) > time.Second {
		t.Fatalf("new key reserved by another Store: %v after %v; want ErrNotFound at once (documented)", err, time.Since(start))
	}
	if err := txn.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Inspect(ctx, idempotency.Key{ID: "absent"}, true); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("absent: %v; want ErrNotFound", err)
	}
}

// TestForget: a key held by a live lease or by an open transaction of the
// Store is refused at once with ErrInProgress and nothing changes; a
// completed key is deleted and returned (no body), then Do runs fn again;
// an unfinished key whose lease ended is deleted; an absent key gives
// ErrNotFound.
func TestForget(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	clock := newTestClock(base)
	f := openFixture(t, 0).clocked(t, clock.now)
	forget := func(id string) (*backend.KeyInfo, time.Duration, error) {
		start := time.Now()
		info, err := f.store.Forget(ctx, idempotency.Key{ID: id})
		return info, time.Since(start), err
	}

	savedKey(t, ctx, f, clock, base, "leased", "A", []byte("s"))
	if info, took, err := forget("leased"); !errors.Is(err, idempotency.ErrInProgress) || info != nil || took > 500*time.Millisecond {
		t.Fatalf("live lease: %v, %v after %v; want ErrInProgress at once", info, err, took)
	}
	wantUnfinished(t, ctx, f, "leased", []byte("s"), "A", base.Add(testLease), 0, base)

	release := hold(t, f, idempotency.Key{ID: "reserved"})
	if info, took, err := forget("reserved"); !errors.Is(err, idempotency.ErrInProgress) || info != nil || took > 500*time.Millisecond {
		t.Fatalf("open Reserve of this Store: %v, %v after %v; want ErrInProgress at once", info, err, took)
	}
	release()
	if _, ok := readRow(t, ctx, f, "reserved"); !ok {
		t.Fatal("the holder's key is gone")
	}

	p := mustAcquire(t, ctx, f.store, acquisition("leased", "A", 0)) // own lease: a phase open
	if _, took, err := forget("leased"); !errors.Is(err, idempotency.ErrInProgress) || took > 500*time.Millisecond {
		t.Fatalf("open phase of this Store: %v after %v; want ErrInProgress at once", err, took)
	}
	if err := p.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	g := guard(t, f.store, nil)
	runs := 0
	fn := func(tx *sql.Tx) (idempotency.Response, error) {
		runs++
		return idempotency.Response{Status: 201, Body: []byte("body")}, f.fx.Effect(ctx, tx, "done")
	}
	if _, err := g.Do(ctx, idempotency.Key{ID: "done"}, "fp", fn); err != nil {
		t.Fatal(err)
	}
	info, _, err := forget("done")
	if err != nil {
		t.Fatal(err)
	}
	sameInfo(t, "forgotten", info, backend.KeyInfo{Key: idempotency.Key{ID: "done"}, State: backend.KeyCompleted, Fingerprint: "fp",
		Status: 201, Header: nil, BodyLen: 4, CreatedAt: base, ExpiresAt: base.Add(24 * time.Hour)})
	if r, ok := readRow(t, ctx, f, "done"); ok {
		t.Fatalf("row after Forget: %+v", r)
	}
	if resp, err := g.Do(ctx, idempotency.Key{ID: "done"}, "fp", fn); err != nil || resp.Replayed || runs != 2 {
		t.Fatalf("Do after Forget: %+v, %v, %d runs; want fn run again", resp, err, runs)
	}
	testkit.MustCount(t, ctx, f.fx.Count, "done", 2)

	clock.set(base.Add(testLease))
	info, _, err = forget("leased")
	if err != nil || info.State != backend.KeyUnfinished || string(info.Progress) != "s" || !info.LeaseEnds.Equal(base.Add(testLease)) {
		t.Fatalf("lease ended: %+v, %v; want deleted as unfinished", info, err)
	}
	if _, _, err := forget("leased"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("forgotten twice: %v; want ErrNotFound", err)
	}
	if _, _, err := forget("absent"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("absent: %v; want ErrNotFound", err)
	}
}

// TestForgetBounded: Forget never waits long. The Store's write turn held
// by a caller of another key gives ErrConflict after about a second (the
// database is busy, the key is not held); SQLite's write lock held by
// another Store (which may hold the key) gives ErrInProgress after about a
// second; the rows stay.
func TestForgetBounded(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 0)
	completeKey(t, ctx, f.store, nil, time.Now(), idempotency.Key{ID: "done"}, nil, []byte("x"))
	check := func(what string, want error) {
		t.Helper()
		start := time.Now()
		info, err := f.store.Forget(ctx, idempotency.Key{ID: "done"})
		took := time.Since(start)
		if !errors.Is(err, want) || info != nil || took < 900*time.Millisecond || took > 2*time.Second {
			t.Fatalf("%s: %v, %v after %v; want %v after about 1s", what, info, err, took, want)
		}
		if errors.Is(want, backend.ErrConflict) && errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("%s: %v; want not ErrInProgress", what, err)
		}
		if _, ok := readRow(t, ctx, f, "done"); !ok {
			t.Fatalf("%s: the row is gone", what)
		}
	}
	release := hold(t, f, idempotency.Key{ID: "other"})
	check("write turn held for another key", backend.ErrConflict)
	release()

	other := stores(t, ctx, f, 2)[1]
	txn, _, err := other.Reserve(ctx, reservation(idempotency.Key{ID: "outside"}, time.Now(), 0))
	if err != nil {
		t.Fatal(err)
	}
	check("write lock held by another Store", idempotency.ErrInProgress)
	if err := txn.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Forget(ctx, idempotency.Key{ID: "done"}); err != nil {
		t.Fatalf("once the lock is free: %v", err)
	}
}

// TestProcessForget: a key held by another process (fn running, SQLite's
// write lock held there) is refused with ErrInProgress within the bound,
// and its effect and row are untouched; once the holder dies, the key has
// no row (ErrNotFound).
func TestProcessForget(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f, path := processFixture(t)
	kill := holdInChild(t, ctx, f, path, "held")
	start := time.Now()
	info, err := f.store.Forget(ctx, idempotency.Key{ID: "held"})
	if took := time.Since(start); !errors.Is(err, idempotency.ErrInProgress) || info != nil || took > 2*time.Second {
		t.Fatalf("key held by another process: %v, %v after %v; want ErrInProgress within about 1s", info, err, took)
	}
	kill()
	if _, err := f.store.Forget(ctx, idempotency.Key{ID: "held"}); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("after the holder died: %v; want ErrNotFound", err)
	}
	testkit.MustCount(t, ctx, f.fx.Count, "held", 0)
}

// TestList: the keys of one scope, those with progress first, each part
// by id in byte order ("Z" < "_" < "a"), in pages that resume exactly at
// the cursor, whatever the page size; no key of another scope.
func TestList(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	clock := newTestClock(base)
	f := openFixture(t, 0).clocked(t, clock.now)
	for _, scope := range []string{"s", "t"} {
		for _, id := range []string{"~", "B", "a", "_", "A0"} {
			completeKey(t, ctx, f.store, clock, base, idempotency.Key{Scope: scope, ID: id}, nil, []byte(id))
		}
		for i, id := range []string{"b", "Z"} {
			a := acquisition(id, "A", 0)
			a.Key.Scope = scope
			p := mustAcquire(t, ctx, f.store, a)
			end := p.Save
			if i == 0 {
				end = p.Release
			}
			if err := end(ctx, []byte(id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := "Z:in_progress:true b:unfinished:true A0:completed:false B:completed:false _:completed:false a:completed:false ~:completed:false"
	for _, limit := range []int{1, 2, 3, 7, 1000} {
		var got, pages []string
		q := backend.ListQuery{Scope: "s", Limit: limit}
		for range 10 {
			page, err := f.store.List(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, k := range page.Keys {
				if k.Key.Scope != "s" || k.Body != nil || k.Fingerprint != "fp" {
					t.Fatalf("listed %+v", k)
				}
				got = append(got, fmt.Sprintf("%s:%v:%v", k.Key.ID, k.State, k.Progress != nil))
				ids = append(ids, k.Key.ID)
			}
			pages = append(pages, strings.Join(ids, ","))
			if page.Next == nil {
				break
			}
			if last := page.Keys[len(page.Keys)-1]; page.Next.ID != last.Key.ID || page.Next.Unfinished != (last.Progress != nil) {
				t.Fatalf("limit %d: cursor %+v after %s", limit, *page.Next, last.Key.ID)
			}
			q.After = page.Next
		}
		if strings.Join(got, " ") != want {
			t.Errorf("limit %d: listed %s\nwant %s", limit, strings.Join(got, " "), want)
		}
		if wantPages := (7 + limit - 1) / limit; len(pages) != wantPages {
			t.Errorf("limit %d: pages %q; want %d", limit, pages, wantPages)
		}
	}
	page, err := f.store.List(ctx, backend.ListQuery{Scope: "s", Limit: 3})
	if err != nil || len(page.Keys) != 3 || page.Keys[2].BodyLen != 2 || page.Next == nil || *page.Next != (backend.ListCursor{ID: "A0"}) {
		t.Fatalf("first page of 3: %+v, %v; want Z, b, A0 (BodyLen 2), next after A0 among the finished", page, err)
	}
	if page, err := f.store.List(ctx, backend.ListQuery{Scope: "none", Limit: 3}); err != nil || len(page.Keys) != 0 || page.Next != nil {
		t.Fatalf("empty scope: %+v, %v", page, err)
	}
}

// TestStats: exact counts by state, by the store's test clock, as leases
// end and records expire.
func TestStats(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	clock := newTestClock(base)
	f := openFixture(t, 0).clocked(t, clock.now)
	completeKey(t, ctx, f.store, clock, base.Add(-2*time.Hour), idempotency.Key{ID: "old"}, nil, []byte("expired body"))
	for i, id := range []string{"r1", "r2"} { // released: 1 and 2 tries
		clock.set(base.Add(-time.Duration(30-10*i) * time.Minute))
		for range i + 1 {
			p := mustAcquire(t, ctx, f.store, acquisition(id, "A", 0))
			if err := p.Release(ctx, []byte(id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	savedKey(t, ctx, f, clock, base.Add(-10*time.Minute), "ended", "A", []byte("e")) // lease ended at base-9min
	savedKey(t, ctx, f, clock, base, "live", "A", []byte("l"))
	completeKey(t, ctx, f.store, clock, base, idempotency.Key{ID: "c1"}, nil, []byte("abc"))
	completeKey(t, ctx, f.store, clock, base, idempotency.Key{ID: "c2"}, nil, []byte("12345"))
	for _, c := range []struct {
		at   time.Time
		want backend.Stats
	}{
		{base, backend.Stats{InProgress: 1, Unfinished: 3, Completed: 2, Expired: 1, Failing: 2, OldestUnfinished: base.Add(-30 * time.Minute), BodyBytes: 8}},
		{base.Add(testLease), backend.Stats{InProgress: 0, Unfinished: 4, Completed: 2, Expired: 1, Failing: 2, OldestUnfinished: base.Add(-30 * time.Minute), BodyBytes: 8}},
		{base.Add(testTTL), backend.Stats{InProgress: 0, Unfinished: 4, Completed: 0, Expired: 3, Failing: 2, OldestUnfinished: base.Add(-30 * time.Minute), BodyBytes: 0}},
	} {
		clock.set(c.at)
		got, err := f.store.Stats(ctx)
		if err != nil || got != c.want {
			t.Errorf("Stats at base+%v: %+v, %v\nwant %+v", c.at.Sub(base), got, err, c.want)
		}
	}
	// An open reservation has no committed row: not counted.
	release := hold(t, f, idempotency.Key{ID: "open"})
	if got, err := f.store.Stats(ctx); err != nil || got.InProgress != 0 || got.Completed != 0 {
		t.Errorf("with an open reservation: %+v, %v", got, err)
	}
	release()
	if _, err := f.db.ExecContext(ctx, `DELETE FROM "`+f.table+`"`); err != nil {
		t.Fatal(err)
	}
	if got, err := f.store.Stats(ctx); err != nil || got != (backend.Stats{}) {
		t.Errorf("empty table: %+v, %v; want zero", got, err)
	}
}

// TestAdminReadsBareDSN: on a database opened with no DSN option (rollback
// journal, no busy timeout), Inspect, List, Stats and Abandoned meet
// SQLITE_BUSY while writers commit; they wait for the commits rather than
// fail.
func TestAdminReadsBareDSN(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newFixture(t, openBare(t, filepath.Join(t.TempDir(), "bare.db")), 0)
	g := guard(t, f.store, &idempotency.Config{WaitTimeout: 10 * time.Second})
	p := mustAcquire(t, ctx, f.store, acquisition("op", "A", 0))
	if err := p.Release(ctx, []byte("s")); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				writerDone <- nil
				return
			default:
			}
			id := fmt.Sprint("w", i)
			if _, err := g.Do(ctx, idempotency.Key{ID: id}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 200, Body: []byte(id)}, f.fx.Effect(ctx, tx, "w")
			}); err != nil {
				writerDone <- err
				return
			}
		}
	}()
	deadline := time.Now().Add(time.Second)
	reads := 0
	for time.Now().Before(deadline) {
		if _, err := f.store.Inspect(ctx, idempotency.Key{ID: "op"}, true); err != nil {
			t.Fatalf("Inspect after %d reads: %v", reads, err)
		}
		if _, err := f.store.List(ctx, backend.ListQuery{Limit: 5}); err != nil {
			t.Fatalf("List after %d reads: %v", reads, err)
		}
		if _, err := f.store.Stats(ctx); err != nil {
			t.Fatalf("Stats after %d reads: %v", reads, err)
		}
		if keys, err := f.store.Abandoned(ctx, backend.AbandonedQuery{MaxTries: 5, Limit: 5}); err != nil || len(keys) != 1 {
			t.Fatalf("Abandoned after %d reads: %v, %v", reads, keys, err)
		}
		reads++
	}
	close(stop)
	if err := <-writerDone; err != nil {
		t.Fatalf("writer: %v", err)
	}
	if n, err := f.fx.Count(ctx, "w"); err != nil || n == 0 {
		t.Fatalf("the writer committed %d keys (%v); want some", n, err)
	}
	t.Logf("%d rounds of reads while the writer committed", reads)
}
