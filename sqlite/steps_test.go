package sqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/sqlite"
)

// testClock is a store's test clock (Config.Clock) that a test sets.
type testClock struct{ p atomic.Pointer[time.Time] }

func newTestClock(at time.Time) *testClock {
	c := &testClock{}
	c.set(at)
	return c
}

func (c *testClock) now() time.Time   { return *c.p.Load() }
func (c *testClock) set(at time.Time) { c.p.Store(&at) }

// base is the test clock's starting reading.
var base = time.Unix(1_700_000_000, 0).UTC()

const (
	testLease = time.Minute
	testTTL   = time.Hour
)

// acquisition asks for key id for owner, waiting up to wait.
func acquisition(id, owner string, wait time.Duration) backend.Acquisition {
	return backend.Acquisition{
		Reservation: backend.Reservation{Key: idempotency.Key{ID: id}, Fingerprint: "fp", TTL: testTTL, Wait: wait},
		Owner:       owner,
		Lease:       testLease,
	}
}

// rawRow is a key's row as stored.
type rawRow struct {
	fp, state        string
	status           int64
	body             []byte
	progress         []byte
	progressNull     bool
	owner            sql.NullString
	leaseEnds        sql.NullInt64
	tries            int64
	created, expires int64
}

// readRow reads key id's row (scope ""); ok is false when there is none.
func readRow(t testing.TB, ctx context.Context, f *fixture, id string) (r rawRow, ok bool) {
	t.Helper()
	err := f.db.QueryRowContext(ctx, `SELECT fingerprint, state, status, body, progress, progress IS NULL, owner, lease_ends, tries, created_at, expires_at
FROM "`+f.table+`" WHERE scope = '' AND id = ?`, id).
		Scan(&r.fp, &r.state, &r.status, &r.body, &r.progress, &r.progressNull, &r.owner, &r.leaseEnds, &r.tries, &r.created, &r.expires)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false
	}
	if err != nil {
		t.Fatalf("read row %q: %v", id, err)
	}
	return r, true
}

// mustRow reads key id's row and fails t if there is none.
func mustRow(t testing.TB, ctx context.Context, f *fixture, id string) rawRow {
	t.Helper()
	r, ok := readRow(t, ctx, f, id)
	if !ok {
		t.Fatalf("key %q: no row", id)
	}
	return r
}

// wantUnfinished checks that key id's row is unfinished with progress,
// owner (NULL if ""), lease end, tries and creation.
func wantUnfinished(t testing.TB, ctx context.Context, f *fixture, id string, progress []byte, owner string, leaseEnds time.Time, tries int64, created time.Time) {
	t.Helper()
	r := mustRow(t, ctx, f, id)
	if r.state != "pending" || r.progressNull || !bytes.Equal(r.progress, progress) || r.owner.Valid != (owner != "") || r.owner.String != owner ||
		!r.leaseEnds.Valid || r.leaseEnds.Int64 != leaseEnds.UnixNano() || r.tries != tries ||
		r.created != created.UnixNano() || r.expires != backend.MaxExpiry().UnixNano() || r.fp != "fp" {
		t.Fatalf("key %q: row %+v; want pending, fp, progress %q, owner %q, lease ends %d, tries %d, created %d, expires MaxExpiry",
			id, r, progress, owner, leaseEnds.UnixNano(), tries, created.UnixNano())
	}
}

// mustAcquire acquires a and fails t unless it gets a Phase.
func mustAcquire(t testing.TB, ctx context.Context, s *sqlite.Store, a backend.Acquisition) backend.Phase[*sql.Tx] {
	t.Helper()
	p, rec, err := s.Acquire(ctx, a)
	if err != nil || p == nil || rec != nil {
		t.Fatalf("Acquire %q by %q: %v, %v, %v; want a Phase", a.Key.ID, a.Owner, p, rec, err)
	}
	return p
}

// savedKey leaves key id unfinished with progress, leased to owner from
// the clock's reading at (the lease ends at + testLease), one effect
// committed with it.
func savedKey(t testing.TB, ctx context.Context, f *fixture, clock *testClock, at time.Time, id, owner string, progress []byte) {
	t.Helper()
	clock.set(at)
	p := mustAcquire(t, ctx, f.store, acquisition(id, owner, 0))
	if err := f.fx.Effect(ctx, p.Tx(), id); err != nil {
		t.Fatal(err)
	}
	if err := p.Save(ctx, progress); err != nil {
		t.Fatalf("Save %q: %v", id, err)
	}
}

// TestAcquireNewKey: a new key gives a Phase with no progress and the
// Acquisition's fingerprint. Save commits the effect, the progress (binary
// bytes, byte-exact), the owner's lease until the clock plus Lease and
// MaxExpiry; Rollback instead leaves no row and no effect, and the key is
// free.
func TestAcquireNewKey(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	clock := newTestClock(base)
	f := openFixture(t, 0).clocked(t, clock.now)

	p := mustAcquire(t, ctx, f.store, acquisition("new", "A", 0))
	if p.Progress() != nil || p.Fingerprint() != "fp" || p.Tries() != 0 {
		t.Fatalf("new key: progress %q, fingerprint %q, tries %d; want nil, fp, 0", p.Progress(), p.Fingerprint(), p.Tries())
	}
	if err := f.fx.Effect(ctx, p.Tx(), "new"); err != nil {
		t.Fatal(err)
	}
	clock.set(base.Add(time.Second)) // the lease counts from Save's commit
	progress := []byte{0, 1, 0xfe, 0xff, '\n'}
	if err := p.Save(ctx, progress); err != nil {
		t.Fatal(err)
	}
	testkit.MustCount(t, ctx, f.fx.Count, "new", 1)
	wantUnfinished(t, ctx, f, "new", progress, "A", base.Add(time.Second+testLease), 0, base)
	if err := p.Rollback(ctx); err == nil {
		t.Fatal("Rollback after Save: nil error; want the phase already ended")
	}

	p = mustAcquire(t, ctx, f.store, acquisition("gone", "A", 0))
	if err := f.fx.Effect(ctx, p.Tx(), "gone"); err != nil {
		t.Fatal(err)
	}
	if err := p.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.MustCount(t, ctx, f.fx.Count, "gone", 0)
	if r, ok := readRow(t, ctx, f, "gone"); ok {
		t.Fatalf("after Rollback of a new key: row %+v; want none", r)
	}
	txn, rec, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: "gone"}, base, 0))
	if err != nil || txn == nil || rec != nil {
		t.Fatalf("Reserve after Rollback: %v, %v, %v; want the key free", txn, rec, err)
	}
	if err := txn.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAcquireLeases: the owner of a live lease resumes its key (the saved
// progress byte-exact, MaxProgressLen bytes, the fingerprint the operation
// started with); another owner gets ErrInProgress at once, however long
// its Wait; once the lease has ended by the store's clock, another owner
// takes it over, and its Rollback leaves the row as it was committed.
func TestAcquireLeases(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	clock := newTestClock(base)
	f := openFixture(t, 0).clocked(t, clock.now)
	big := bytes.Repeat([]byte{0, 0xff, 'x'}, backend.MaxProgressLen/3+1)[:backend.MaxProgressLen]
	savedKey(t, ctx, f, clock, base, "k", "A", big)

	clock.set(base.Add(testLease - time.Millisecond))
	a := acquisition("k", "A", 0)
	a.Fingerprint = "other" // the operation's own fingerprint wins
	p := mustAcquire(t, ctx, f.store, a)
	if !bytes.Equal(p.Progress(), big) || p.Fingerprint() != "fp" || p.Tries() != 0 {
		t.Fatalf("own lease: %d bytes of progress (equal: %v), fingerprint %q, tries %d; want the saved ones",
			len(p.Progress()), bytes.Equal(p.Progress(), big), p.Fingerprint(), p.Tries())
	}
	if err := p.Save(ctx, []byte("step2")); err != nil {
		t.Fatal(err)
	}
	leaseEnds := base.Add(2*testLease - time.Millisecond)
	wantUnfinished(t, ctx, f, "k", []byte("step2"), "A", leaseEnds, 0, base)

	clock.set(leaseEnds.Add(-time.Nanosecond))
	start := time.Now()
	p, rec, err := f.store.Acquire(ctx, acquisition("k", "B", 10*time.Second))
	if !errors.Is(err, idempotency.ErrInProgress) || p != nil || rec != nil || time.Since(start) > time.Second {
		t.Fatalf("another owner, lease live: %v, %v, %v after %v; want ErrInProgress at once", p, rec, err, time.Since(start))
	}
	wantUnfinished(t, ctx, f, "k", []byte("step2"), "A", leaseEnds, 0, base)

	clock.set(leaseEnds) // ended: lease_ends <= now
	p = mustAcquire(t, ctx, f.store, acquisition("k", "B", 0))
	if string(p.Progress()) != "step2" || p.Tries() != 0 {
		t.Fatalf("takeover: progress %q, tries %d", p.Progress(), p.Tries())
	}
	if err := f.fx.Effect(ctx, p.Tx(), "k"); err != nil {
		t.Fatal(err)
	}
	if err := p.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wantUnfinished(t, ctx, f, "k", []byte("step2"), "A", leaseEnds, 0, base)
	testkit.MustCount(t, ctx, f.fx.Count, "k", 1)
}

// TestPhaseRelease: Release commits the effect and the progress, ends the
// lease at the store's clock now (owner NULL) and counts one try; another
// owner acquires at once and sees the tries.
func TestPhaseRelease(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	clock := newTestClock(base)
	f := openFixture(t, 0).clocked(t, clock.now)
	savedKey(t, ctx, f, clock, base, "k", "A", []byte("s1"))

	clock.set(base.Add(time.Second))
	p := mustAcquire(t, ctx, f.store, acquisition("k", "A", 0))
	if err := f.fx.Effect(ctx, p.Tx(), "k"); err != nil {
		t.Fatal(err)
	}
	clock.set(base.Add(2 * time.Second))
	if err := p.Release(ctx, []byte("s1 failed")); err != nil {
		t.Fatal(err)
	}
	wantUnfinished(t, ctx, f, "k", []byte("s1 failed"), "", base.Add(2*time.Second), 1, base)
	testkit.MustCount(t, ctx, f.fx.Count, "k", 2)

	p = mustAcquire(t, ctx, f.store, acquisition("k", "B", 0))
	if string(p.Progress()) != "s1 failed" || p.Tries() != 1 {
		t.Fatalf("after Release: progress %q, tries %d; want s1 failed, 1", p.Progress(), p.Tries())
	}
	if err := p.Release(ctx, []byte{}); err != nil { // empty, not nil: still unfinished
		t.Fatal(err)
	}
	wantUnfinished(t, ctx, f, "k", []byte{}, "", base.Add(2*time.Second), 2, base)
	p = mustAcquire(t, ctx, f.store, acquisition("k", "C", 0))
	if p.Progress() == nil || len(p.Progress()) != 0 || p.Tries() != 2 {
		t.Fatalf("empty progress: %#v, tries %d; want empty non-nil, 2", p.Progress(), p.Tries())
	}
	if err := p.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPhaseComplete: Complete stores the response byte-exact, clears
// progress, owner, lease and tries, keeps the operation's creation and
// expires at the clock at completion plus TTL; Reserve and Acquire then
// return the record.
func TestPhaseComplete(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	clock := newTestClock(base)
	f := openFixture(t, 0).clocked(t, clock.now)
	savedKey(t, ctx, f, clock, base, "k", "A", []byte("s1"))
	clock.set(base.Add(time.Hour)) // the lease ended
	p := mustAcquire(t, ctx, f.store, acquisition("k", "B", 0))
	if err := p.Release(ctx, []byte("s1")); err != nil {
		t.Fatal(err)
	}
	clock.set(base.Add(2 * time.Hour))
	p = mustAcquire(t, ctx, f.store, acquisition("k", "B", 0))
	if err := f.fx.Effect(ctx, p.Tx(), "k"); err != nil {
		t.Fatal(err)
	}
	done := base.Add(2*time.Hour + time.Second)
	clock.set(done)
	body := []byte{0, 'o', 'k', 0xff}
	header := map[string][]string{"X-A": {"1", "2"}}
	if err := p.Complete(ctx, idempotency.Response{Status: 201, Header: header, Body: body}); err != nil {
		t.Fatal(err)
	}
	testkit.MustCount(t, ctx, f.fx.Count, "k", 2)
	r := mustRow(t, ctx, f, "k")
	if r.state != "completed" || r.status != 201 || !bytes.Equal(r.body, body) || !r.progressNull || r.owner.Valid || r.leaseEnds.Valid ||
		r.tries != 0 || r.created != base.UnixNano() || r.expires != done.Add(testTTL).UnixNano() {
		t.Fatalf("completed row %+v; want completed 201, body, no progress/owner/lease, tries 0, created %d, expires %d",
			r, base.UnixNano(), done.Add(testTTL).UnixNano())
	}
	check := func(what string, rec *backend.Record, err error) {
		t.Helper()
		if err != nil || rec == nil || rec.Status != 201 || !bytes.Equal(rec.Body, body) || fmt.Sprint(rec.Header) != fmt.Sprint(header) ||
			!rec.CreatedAt.Equal(base) || !rec.ExpiresAt.Equal(done.Add(testTTL)) {
			t.Fatalf("%s after Complete: %+v, %v; want the record", what, rec, err)
		}
	}
	_, rec, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: "k"}, done, 0))
	check("Reserve", rec, err)
	_, rec, err = f.store.Acquire(ctx, acquisition("k", "C", 0))
	check("Acquire", rec, err)
}

// TestPhaseEffects: the writes a phase does through Tx commit with Save,
// Release and Complete, and vanish with Rollback, on a new key and on an
// unfinished one.
func TestPhaseEffects(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 0)
	end := map[string]func(p backend.Phase[*sql.Tx]) error{
		"save":     func(p backend.Phase[*sql.Tx]) error { return p.Save(ctx, []byte("p")) },
		"release":  func(p backend.Phase[*sql.Tx]) error { return p.Release(ctx, []byte("p")) },
		"complete": func(p backend.Phase[*sql.Tx]) error { return p.Complete(ctx, idempotency.Response{Status: 200}) },
		"rollback": func(p backend.Phase[*sql.Tx]) error { return p.Rollback(ctx) },
	}
	for name, fn := range end {
		for _, unfinished := range []bool{false, true} {
			id := fmt.Sprint(name, "-", unfinished)
			if unfinished {
				p := mustAcquire(t, ctx, f.store, acquisition(id, "A", 0))
				if err := p.Release(ctx, []byte("first")); err != nil {
					t.Fatal(err)
				}
			}
			p := mustAcquire(t, ctx, f.store, acquisition(id, "B", 0))
			for range 3 {
				if err := f.fx.Effect(ctx, p.Tx(), id); err != nil {
					t.Fatal(err)
				}
			}
			if err := fn(p); err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			want := 3
			if name == "rollback" {
				want = 0
			}
			testkit.MustCount(t, ctx, f.fx.Count, id, want)
		}
	}
}

// TestStepsValidation: a bad Acquisition (owner empty, longer than 64
// bytes or not printable ASCII, a lease under 1ms, no TTL) and a bad
// progress (nil, longer than MaxProgressLen) are refused with
// ErrInvalidConfig, and nothing is written: a refused Save rolls the phase
// back. Bad limits of Abandoned and List are refused too.
func TestStepsValidation(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 0)
	for name, change := range map[string]func(*backend.Acquisition){
		"empty owner":   func(a *backend.Acquisition) { a.Owner = "" },
		"65-byte owner": func(a *backend.Acquisition) { a.Owner = strings.Repeat("o", 65) },
		"owner \\x01":   func(a *backend.Acquisition) { a.Owner = "a\x01" },
		"owner é":       func(a *backend.Acquisition) { a.Owner = "é" },
		"lease 999µs":   func(a *backend.Acquisition) { a.Lease = time.Millisecond - time.Microsecond },
		"no TTL":        func(a *backend.Acquisition) { a.TTL = 0 },
	} {
		a := acquisition("bad", "A", 0)
		change(&a)
		if p, rec, err := f.store.Acquire(ctx, a); !errors.Is(err, idempotency.ErrInvalidConfig) || p != nil || rec != nil {
			t.Errorf("%s: %v, %v, %v; want ErrInvalidConfig", name, p, rec, err)
		}
	}
	a := acquisition("ok", strings.Repeat("o", 64), 0)
	a.Lease = time.Millisecond
	p := mustAcquire(t, ctx, f.store, a)
	if err := p.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for name, progress := range map[string][]byte{"nil": nil, "MaxProgressLen+1": make([]byte, backend.MaxProgressLen+1)} {
		for _, op := range []string{"Save", "Release"} {
			p := mustAcquire(t, ctx, f.store, acquisition("bad", "A", 0))
			if err := f.fx.Effect(ctx, p.Tx(), "bad"); err != nil {
				t.Fatal(err)
			}
			end := p.Save
			if op == "Release" {
				end = p.Release
			}
			if err := end(ctx, progress); !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Errorf("%s with %s progress: %v; want ErrInvalidConfig", op, name, err)
			}
			if err := p.Rollback(ctx); err == nil {
				t.Errorf("Rollback after a refused %s: nil; want the phase already ended", op)
			}
		}
	}
	if r, ok := readRow(t, ctx, f, "bad"); ok {
		t.Fatalf("row after refused calls: %+v; want none", r)
	}
	testkit.MustCount(t, ctx, f.fx.Count, "bad", 0)
	for _, limit := range []int{0, 1001} {
		if _, err := f.store.Abandoned(ctx, backend.AbandonedQuery{Limit: limit, MaxTries: 1}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("Abandoned limit %d: %v; want ErrInvalidConfig", limit, err)
		}
		if _, err := f.store.List(ctx, backend.ListQuery{Limit: limit}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("List limit %d: %v; want ErrInvalidConfig", limit, err)
		}
	}
	if _, err := f.store.Abandoned(ctx, backend.AbandonedQuery{Limit: 1, Grace: -1}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("Abandoned negative grace: %v; want ErrInvalidConfig", err)
	}
}

// stores returns n Stores on f's file and table, each on a *sql.DB of its
// own (as n processes would hold them); the first is f's.
func stores(t *testing.T, ctx context.Context, f *fixture, n int) []*sqlite.Store {
	t.Helper()
	out := []*sqlite.Store{f.store}
	for len(out) < n {
		s, err := f.reopen(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s.(*sqlite.Store))
	}
	return out
}

// TestAcquireAbandonedTogether: 20 owners, on 4 Stores with pools of their
// own, acquire one abandoned key at once: exactly one gets a Phase (and
// saves at once); every other gets ErrInProgress.
func TestAcquireAbandonedTogether(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 0)
	p := mustAcquire(t, ctx, f.store, acquisition("k", "first", 0))
	if err := p.Release(ctx, []byte("abandoned")); err != nil {
		t.Fatal(err)
	}
	ss := stores(t, ctx, f, 4)
	for round := range 5 {
		if round > 0 {
			// Abandon it again: the winner of the last round releases.
			if _, err := f.db.ExecContext(ctx, `UPDATE "`+f.table+`" SET owner = NULL, lease_ends = 0 WHERE id = 'k'`); err != nil {
				t.Fatal(err)
			}
		}
		const n = 20
		var won atomic.Int32
		winner := make(chan string, n)
		errs := make([]error, n)
		testkit.Together(n, func(i int) {
			owner := fmt.Sprint("owner", i)
			a := acquisition("k", owner, 5*time.Second)
			a.Deadline = time.Now().Add(5 * time.Second)
			p, rec, err := ss[i%len(ss)].Acquire(ctx, a)
			switch {
			case p != nil:
				won.Add(1)
				winner <- owner
				errs[i] = p.Save(ctx, []byte(owner))
			case !errors.Is(err, idempotency.ErrInProgress) || rec != nil:
				errs[i] = fmt.Errorf("%v, %v; want a Phase or ErrInProgress", rec, err)
			}
		})
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d, owner %d: %v", round, i, err)
			}
		}
		if won.Load() != 1 {
			t.Fatalf("round %d: %d Phases; want exactly 1", round, won.Load())
		}
		w := <-winner
		if r := mustRow(t, ctx, f, "k"); r.owner.String != w || string(r.progress) != w {
			t.Fatalf("round %d: row owner %q, progress %q; want the winner %q", round, r.owner.String, r.progress, w)
		}
	}
}

// TestAcquireNewKeyTogether: 20 callers acquire one new key at once, each
// rolling its Phase back after a moment: never two Phases at a time, the
// others wait and get the key after a Rollback (or ErrInProgress at their
// bound), and no effect is left.
func TestAcquireNewKeyTogether(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 0)
	ss := stores(t, ctx, f, 2)
	const n = 20
	var open, most, phases atomic.Int32
	errs := make([]error, n)
	testkit.Together(n, func(i int) {
		a := acquisition("new", fmt.Sprint("owner", i), 10*time.Second)
		a.Deadline = time.Now().Add(10 * time.Second)
		p, rec, err := ss[i%len(ss)].Acquire(ctx, a)
		if p == nil {
			if !errors.Is(err, idempotency.ErrInProgress) || rec != nil {
				errs[i] = fmt.Errorf("%v, %v; want a Phase or ErrInProgress", rec, err)
			}
			return
		}
		phases.Add(1)
		now := open.Add(1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		if p.Progress() != nil {
			errs[i] = fmt.Errorf("progress %q; want nil for a new key", p.Progress())
		}
		if err := f.fx.Effect(ctx, p.Tx(), "new"); err != nil {
			errs[i] = err
		}
		time.Sleep(10 * time.Millisecond)
		open.Add(-1)
		if err := p.Rollback(ctx); err != nil {
			errs[i] = err
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("caller %d: %v", i, err)
		}
	}
	if most.Load() != 1 || phases.Load() < 2 {
		t.Fatalf("%d Phases, at most %d at a time; want at least 2 (a waiter gets the key after a Rollback), never 2 at a time", phases.Load(), most.Load())
	}
	testkit.MustCount(t, ctx, f.fx.Count, "new", 0)
	if r, ok := readRow(t, ctx, f, "new"); ok {
		t.Fatalf("row %+v; want none", r)
	}
}

// TestReserveUnfinished: Reserve and Do treat an unfinished key as held,
// with its lease live or ended: ErrInProgress, fn not run, the row
// unchanged.
func TestReserveUnfinished(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	clock := newTestClock(base)
	f := openFixture(t, 0).clocked(t, clock.now)
	savedKey(t, ctx, f, clock, base, "k", "A", []byte("s1"))
	g := guard(t, f.store, &idempotency.Config{WaitTimeout: 300 * time.Millisecond})
	for _, at := range []time.Time{base, base.Add(100 * 365 * 24 * time.Hour)} { // live, long ended
		clock.set(at)
		txn, rec, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: "k"}, at, time.Second))
		if !errors.Is(err, idempotency.ErrInProgress) || txn != nil || rec != nil {
			t.Fatalf("Reserve at %v: %v, %v, %v; want ErrInProgress", at, txn, rec, err)
		}
		if _, err := g.Do(ctx, idempotency.Key{ID: "k"}, "fp", mustNotRun); !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("Do at %v: %v; want ErrInProgress", at, err)
		}
		wantUnfinished(t, ctx, f, "k", []byte("s1"), "A", base.Add(testLease), 0, base)
	}
	testkit.MustCount(t, ctx, f.fx.Count, "k", 1)
}

// TestPurgeSkipsUnfinished: with every record expired a hundred years
// later, Purge deletes the completed ones and never an unfinished key,
// leased or released.
func TestPurgeSkipsUnfinished(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	clock := newTestClock(base)
	f := openFixture(t, 0).clocked(t, clock.now)
	for i := range 3 {
		txn, _, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: fmt.Sprint("done", i)}, base, 0))
		if err != nil {
			t.Fatal(err)
		}
		if err := txn.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	savedKey(t, ctx, f, clock, base, "leased", "A", []byte("s"))
	p := mustAcquire(t, ctx, f.store, acquisition("released", "A", 0))
	if err := p.Release(ctx, []byte("s")); err != nil {
		t.Fatal(err)
	}
	clock.set(base.Add(100 * 365 * 24 * time.Hour))
	if n, err := f.store.Purge(ctx, 100); err != nil || n != 3 {
		t.Fatalf("Purge: %d, %v; want the 3 completed keys", n, err)
	}
	for _, id := range []string{"leased", "released"} {
		if r := mustRow(t, ctx, f, id); r.progressNull {
			t.Fatalf("%s after Purge: %+v; want unfinished", id, r)
		}
	}
	var n int
	if err := f.db.QueryRowContext(ctx, `SELECT count(*) FROM "`+f.table+`"`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows after Purge: %d, %v; want 2", n, err)
	}
}

// TestAbandoned: only unfinished keys whose lease ended at least Grace ago
// and whose tries are under MaxTries, the longest ended first, up to
// Limit, with their fields; it takes no lease.
func TestAbandoned(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	clock := newTestClock(base)
	f := openFixture(t, 0).clocked(t, clock.now)
	// released at base+i seconds, i tries each (a1 1 try, a2 2 tries, ...).
	for i := 1; i <= 4; i++ {
		id := fmt.Sprint("a", i)
		for range i {
			clock.set(base.Add(time.Duration(i) * time.Second))
			p := mustAcquire(t, ctx, f.store, acquisition(id, "A", 0))
			if err := p.Release(ctx, []byte(id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	savedKey(t, ctx, f, clock, base, "leased", "A", []byte("leased")) // ends at base+1min
	txn, _, err := f.store.Reserve(ctx, reservation(idempotency.Key{ID: "done"}, base, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := txn.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	clock.set(base.Add(10 * time.Second))
	list := func(q backend.AbandonedQuery) string {
		t.Helper()
		keys, err := f.store.Abandoned(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, k := range keys {
			if string(k.Progress) != k.Key.ID && k.Key.ID != "leased" || k.Fingerprint != "fp" || k.Key.Scope != "" {
				t.Errorf("abandoned %+v: fields not the row's", k)
			}
			out = append(out, fmt.Sprintf("%s:%d@%d", k.Key.ID, k.Tries, k.LeaseEnded.Sub(base)/time.Second))
		}
		return strings.Join(out, " ")
	}
	for _, c := range []struct {
		q    backend.AbandonedQuery
		want string
	}{
		{backend.AbandonedQuery{MaxTries: 10, Limit: 10}, "a1:1@1 a2:2@2 a3:3@3 a4:4@4"},
		{backend.AbandonedQuery{MaxTries: 10, Limit: 2}, "a1:1@1 a2:2@2"},
		{backend.AbandonedQuery{MaxTries: 3, Limit: 10}, "a1:1@1 a2:2@2"},
		{backend.AbandonedQuery{Grace: 7 * time.Second, MaxTries: 10, Limit: 10}, "a1:1@1 a2:2@2 a3:3@3"},
		{backend.AbandonedQuery{Grace: 9 * time.Second, MaxTries: 10, Limit: 10}, "a1:1@1"},
		{backend.AbandonedQuery{Grace: 10 * time.Second, MaxTries: 10, Limit: 10}, ""},
		{backend.AbandonedQuery{MaxTries: 0, Limit: 10}, ""},
	} {
		if got := list(c.q); got != c.want {
			t.Errorf("Abandoned(%+v) = %q; want %q", c.q, got, c.want)
		}
	}
	clock.set(base.Add(testLease)) // the leased key's lease ended just now
	if got := list(backend.AbandonedQuery{MaxTries: 1, Limit: 10}); got != "leased:0@60" {
		t.Errorf("after the lease ended: %q; want leased:0@60", got)
	}
	// No lease was taken: the rows are as released, and acquirable.
	wantUnfinished(t, ctx, f, "a1", []byte("a1"), "", base.Add(time.Second), 1, base.Add(time.Second))
	p := mustAcquire(t, ctx, f.store, acquisition("a1", "B", 0))
	if err := p.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
}

// v010Schema is the DDL of v0.1.0 (commit 08bdc8f), byte for byte.
const v010Schema = `-- The keys table of github.com/go-idempotency/idempotency/sqlite.
-- Times are unix nanoseconds; scope and id compare byte by byte (BINARY).
CREATE TABLE IF NOT EXISTS "idempotency_keys" (
	scope       TEXT    NOT NULL COLLATE BINARY,
	id          TEXT    NOT NULL COLLATE BINARY,
	fingerprint TEXT    NOT NULL,
	state       TEXT    NOT NULL CHECK (state IN ('pending', 'completed')),
	status      INTEGER NOT NULL DEFAULT 0,
	header      BLOB,
	body        BLOB,
	created_at  INTEGER NOT NULL,
	expires_at  INTEGER NOT NULL,
	PRIMARY KEY (scope, id)
);
CREATE INDEX IF NOT EXISTS "idempotency_keys_expires_at" ON "idempotency_keys" (expires_at);
`

// TestMigrateV010: on a table made by v0.1.0's DDL, Do and Purge work
// before the upgrade. Migrate adds the columns and indexes, twice in a
// row and from 4 goroutines on 4 pools at once; the old record still
// replays byte-exact, and an operation runs.
func TestMigrateV010(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	path := filepath.Join(t.TempDir(), "v010.db")
	db, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	table := testkit.Name("old_")
	if _, err := db.ExecContext(ctx, strings.ReplaceAll(v010Schema, "idempotency_keys", table)); err != nil {
		t.Fatal(err)
	}
	fx := testkit.Effects{DB: db, Table: `"` + table + `_effects"`}
	if err := fx.Create(ctx, "TEXT"); err != nil {
		t.Fatal(err)
	}
	store, err := sqlite.New(db, &sqlite.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	g := guard(t, store, nil)
	body := []byte{0, 'o', 'l', 'd', 0xff}
	fn := func(tx *sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201, Header: map[string][]string{"A": {"b"}}, Body: body}, fx.Effect(ctx, tx, "old")
	}
	if _, err := g.Do(ctx, idempotency.Key{ID: "old"}, "fp", fn); err != nil {
		t.Fatalf("Do on the v0.1.0 table: %v", err)
	}
	if n, err := store.Purge(ctx, 10); err != nil || n != 0 {
		t.Fatalf("Purge on the v0.1.0 table: %d, %v; want 0, nil", n, err)
	}
	columns := func(table string) string {
		t.Helper()
		var names []string
		rows, err := db.QueryContext(ctx, `SELECT name || ' ' || type || ' ' || "notnull" || ' ' || coalesce(dflt_value, '-') FROM pragma_table_info(?)`, table)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			names = append(names, n)
		}
		return strings.Join(names, ", ")
	}
	for range 2 {
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ss := []*sqlite.Store{store}
	for range 3 {
		db, err := sqlite.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		s, err := sqlite.New(db, &sqlite.Config{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	errs := make([]error, len(ss))
	testkit.Together(len(ss), func(i int) { errs[i] = ss[i].Migrate(ctx) })
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent Migrate: %v", err)
	}
	// A fresh table made by Schema has the same columns.
	fresh, err := sqlite.New(db, &sqlite.Config{Table: table + "_fresh"})
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	upgraded := columns(table)
	if got := columns(table + "_fresh"); got != upgraded {
		t.Fatalf("columns of a fresh table: %s\nof the upgraded one: %s", got, upgraded)
	}
	if !strings.HasSuffix(upgraded, "progress BLOB 0 -, owner TEXT 0 -, lease_ends INTEGER 0 -, tries INTEGER 1 0") {
		t.Fatalf("upgraded columns: %s", upgraded)
	}
	var indexes int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND tbl_name = ? AND sql LIKE '%WHERE progress IS NOT NULL'`, table).Scan(&indexes); err != nil || indexes != 2 {
		t.Fatalf("partial indexes: %d, %v; want 2", indexes, err)
	}

	resp, err := g.Do(ctx, idempotency.Key{ID: "old"}, "fp", mustNotRun)
	if err != nil || !resp.Replayed || resp.Status != 201 || !bytes.Equal(resp.Body, body) || resp.Header.Get("A") != "b" {
		t.Fatalf("old record after the upgrade: %+v, %v; want the replay", resp, err)
	}
	info, err := store.Inspect(ctx, idempotency.Key{ID: "old"}, true)
	if err != nil || info.State != backend.KeyCompleted || info.Progress != nil || info.Tries != 0 || !bytes.Equal(info.Body, body) {
		t.Fatalf("Inspect of the old record: %+v, %v", info, err)
	}
	a := acquisition("op", "A", 0)
	p := mustAcquire(t, ctx, store, a)
	if err := fx.Effect(ctx, p.Tx(), "op"); err != nil {
		t.Fatal(err)
	}
	if err := p.Save(ctx, []byte("s1")); err != nil {
		t.Fatal(err)
	}
	p = mustAcquire(t, ctx, ss[3], a)
	if string(p.Progress()) != "s1" {
		t.Fatalf("resumed progress %q", p.Progress())
	}
	if err := fx.Effect(ctx, p.Tx(), "op"); err != nil {
		t.Fatal(err)
	}
	if err := p.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("op done")}); err != nil {
		t.Fatal(err)
	}
	resp, err = g.Do(ctx, idempotency.Key{ID: "op"}, "fp", mustNotRun)
	if err != nil || !resp.Replayed || string(resp.Body) != "op done" {
		t.Fatalf("the operation's record: %+v, %v", resp, err)
	}
	testkit.MustCount(t, ctx, fx.Count, "op", 2)
	testkit.MustCount(t, ctx, fx.Count, "old", 1)
}

// TestStepsOneConnection: with a pool of one connection, a whole
// operation (Acquire, Save, Acquire, Release, Acquire, Complete) and the
// admin calls between its phases run: a phase never asks for a second
// connection.
func TestStepsOneConnection(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := openFixture(t, 1)
	a := acquisition("k", "A", 0)
	for _, end := range []string{"save", "release", "complete"} {
		p := mustAcquire(t, ctx, f.store, a)
		if err := f.fx.Effect(ctx, p.Tx(), "k"); err != nil {
			t.Fatal(err)
		}
		var err error
		switch end {
		case "save":
			err = p.Save(ctx, []byte("s"))
		case "release":
			err = p.Release(ctx, []byte("s"))
		default:
			err = p.Complete(ctx, idempotency.Response{Status: 200})
		}
		if err != nil {
			t.Fatalf("%s: %v", end, err)
		}
		if _, err := f.store.Inspect(ctx, a.Key, false); err != nil {
			t.Fatal(err)
		}
	}
	testkit.MustCount(t, ctx, f.fx.Count, "k", 3)
}
