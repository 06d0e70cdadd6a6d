package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// stepStart is the test clock's first reading in the tests of multi-step
// operations: whole microseconds, as the store keeps them.
var stepStart = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// maxExpiry is backend.MaxExpiry as the store keeps it.
var maxExpiry = backend.MaxExpiry().Truncate(time.Microsecond)

// stepFixture is a fixture whose store reads a test clock that the test
// sets.
type stepFixture struct {
	*fixture
	clock atomic.Pointer[time.Time]
}

func newStepFixture(t testing.TB, cfg postgres.Config, maxConns int, configure ...func(*pgxpool.Config)) *stepFixture {
	t.Helper()
	f := &stepFixture{}
	f.set(0)
	cfg.Clock = func() time.Time { return *f.clock.Load() }
	f.fixture = newFixture(t, newPool(t, maxConns, configure...), cfg)
	return f
}

// set sets the test clock to stepStart plus d.
func (f *stepFixture) set(d time.Duration) {
	now := stepStart.Add(d)
	f.clock.Store(&now)
}

// at is stepStart plus d.
func at(d time.Duration) time.Time { return stepStart.Add(d) }

// acq is an Acquisition of key id (scope "s") by owner, with a one-hour
// TTL, a ten-second lease and no wait.
func acq(id, owner string) backend.Acquisition {
	return backend.Acquisition{
		Reservation: backend.Reservation{Key: idempotency.Key{Scope: "s", ID: id}, Fingerprint: "fp", TTL: time.Hour},
		Owner:       owner,
		Lease:       10 * time.Second,
	}
}

// dbRow is a key's row as the table holds it.
type dbRow struct {
	fp, state string
	status    *int32
	body      []byte
	created   time.Time
	expires   time.Time
	progress  []byte
	owner     *string
	leaseEnds *time.Time
	tries     int32
}

// row reads the row of key id in scope "s"; ok is false if there is none.
func (f *fixture) row(t testing.TB, ctx context.Context, id string) (r dbRow, ok bool) {
	t.Helper()
	err := f.pool.QueryRow(ctx, `SELECT fingerprint, state, status, body, created_at, expires_at, progress, owner, lease_ends, tries
		FROM "`+f.table+`" WHERE scope = 's' AND id = $1`, id).
		Scan(&r.fp, &r.state, &r.status, &r.body, &r.created, &r.expires, &r.progress, &r.owner, &r.leaseEnds, &r.tries)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	if err != nil {
		t.Fatalf("read row %q: %v", id, err)
	}
	return r, true
}

// mustUnfinished fails t unless key id's row is unfinished with exactly
// these progress, owner ("" for NULL), lease end and tries.
func (f *fixture) mustUnfinished(t testing.TB, ctx context.Context, id, progress, owner string, leaseEnds time.Time, tries int32) dbRow {
	t.Helper()
	r, ok := f.row(t, ctx, id)
	switch {
	case !ok:
		t.Fatalf("key %q: no row, want unfinished", id)
	case r.state != "pending" || !bytes.Equal(r.progress, []byte(progress)) || r.progress == nil || r.tries != tries:
		t.Fatalf("key %q: state %q progress %q tries %d; want pending, %q, %d", id, r.state, r.progress, r.tries, progress, tries)
	case owner == "" && r.owner != nil, owner != "" && (r.owner == nil || *r.owner != owner):
		t.Fatalf("key %q: owner %v, want %q", id, r.owner, owner)
	case r.leaseEnds == nil || !r.leaseEnds.Equal(leaseEnds):
		t.Fatalf("key %q: lease_ends %v, want %v", id, r.leaseEnds, leaseEnds)
	case !r.expires.Equal(maxExpiry) || r.status != nil || r.body != nil:
		t.Fatalf("key %q: expires_at %v status %v body %q; want %v, NULL, NULL", id, r.expires, r.status, r.body, maxExpiry)
	}
	return r
}

// mustPhase acquires a and fails t unless it gets a phase.
func mustPhase(t testing.TB, ctx context.Context, s *postgres.Store, a backend.Acquisition) backend.Phase[pgx.Tx] {
	t.Helper()
	p, rec, err := s.Acquire(ctx, a)
	if err != nil || rec != nil || p == nil {
		t.Fatalf("Acquire(%s, %s): got %v, %v, %v; want a phase", a.Key.ID, a.Owner, p, rec, err)
	}
	return p
}

// mustInProgress acquires a and fails t unless it gets ErrInProgress.
func mustInProgress(t testing.TB, ctx context.Context, s *postgres.Store, a backend.Acquisition) {
	t.Helper()
	p, rec, err := s.Acquire(ctx, a)
	if !errors.Is(err, idempotency.ErrInProgress) || p != nil || rec != nil {
		if p != nil {
			_ = p.Rollback(ctx)
		}
		t.Fatalf("Acquire(%s, %s): got %v, %v, %v; want ErrInProgress", a.Key.ID, a.Owner, p, rec, err)
	}
}

// TestAcquireLifecycle walks one key through every phase ending: a new key
// saved, refused to another owner while its lease lives, resumed by its
// owner and rolled back, taken over once the lease ended and released,
// resumed and completed, then replayed by Acquire and by Do.
func TestAcquireLifecycle(t *testing.T) {
	for _, c := range []struct {
		name      string
		cfg       postgres.Config
		configure []func(*pgxpool.Config)
	}{
		{"ReadCommitted", postgres.Config{}, nil},
		{"Serializable", postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}, nil},
		{"SessionRepeatableRead", postgres.Config{}, []func(*pgxpool.Config){isolation("repeatable read")}},
		{"SimpleProtocol", postgres.Config{}, []func(*pgxpool.Config){func(c *pgxpool.Config) {
			c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testkit.Context(t, testTimeout)
			f := newStepFixture(t, c.cfg, 4, c.configure...)
			s := f.store

			// A new key: no progress; Save writes the unfinished row with
			// the step's effect.
			p := mustPhase(t, ctx, s, acq("k", "o1"))
			if p.Progress() != nil || p.Tries() != 0 || p.Fingerprint() != "fp" {
				t.Fatalf("new key: progress %q tries %d fp %q; want nil, 0, fp", p.Progress(), p.Tries(), p.Fingerprint())
			}
			if err := f.effect(ctx, p.Tx(), "step1"); err != nil {
				t.Fatal(err)
			}
			f.set(time.Second)
			if err := p.Save(ctx, []byte("p1")); err != nil {
				t.Fatalf("Save: %v", err)
			}
			r := f.mustUnfinished(t, ctx, "k", "p1", "o1", at(11*time.Second), 0)
			if !r.created.Equal(at(0)) || r.fp != "fp" {
				t.Fatalf("created_at %v fingerprint %q, want %v, fp", r.created, r.fp, at(0))
			}
			testkit.MustCount(t, ctx, f.count, "step1", 1)
			if err := p.Save(ctx, []byte("again")); !errors.Is(err, pgx.ErrTxClosed) {
				t.Fatalf("Save after Save: %v, want pgx.ErrTxClosed", err)
			}

			// Another owner: refused at once while the lease lives, even
			// when it may wait.
			mustInProgress(t, ctx, s, acq("k", "o2"))
			a := acq("k", "o2")
			a.Wait = 5 * time.Second
			start := time.Now()
			mustInProgress(t, ctx, s, a)
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("a live lease was reported after %v, want at once", d)
			}

			// Its owner resumes it (with the operation's fingerprint, not
			// the Acquisition's); a rollback changes nothing.
			a = acq("k", "o1")
			a.Fingerprint = "other"
			p = mustPhase(t, ctx, s, a)
			if string(p.Progress()) != "p1" || p.Tries() != 0 || p.Fingerprint() != "fp" {
				t.Fatalf("resumed: progress %q tries %d fp %q; want p1, 0, fp", p.Progress(), p.Tries(), p.Fingerprint())
			}
			if err := f.effect(ctx, p.Tx(), "rolled"); err != nil {
				t.Fatal(err)
			}
			if err := p.Rollback(ctx); err != nil {
				t.Fatalf("Rollback: %v", err)
			}
			f.mustUnfinished(t, ctx, "k", "p1", "o1", at(11*time.Second), 0)
			testkit.MustCount(t, ctx, f.count, "rolled", 0)

			// The lease ended (by the store's clock): another owner takes
			// it over and releases it after a failure.
			f.set(11 * time.Second)
			p = mustPhase(t, ctx, s, acq("k", "o2"))
			if string(p.Progress()) != "p1" {
				t.Fatalf("taken over: progress %q, want p1", p.Progress())
			}
			if err := f.effect(ctx, p.Tx(), "released"); err != nil {
				t.Fatal(err)
			}
			f.set(12 * time.Second)
			if err := p.Release(ctx, []byte("p2")); err != nil {
				t.Fatalf("Release: %v", err)
			}
			f.mustUnfinished(t, ctx, "k", "p2", "", at(12*time.Second), 1)
			testkit.MustCount(t, ctx, f.count, "released", 1)

			// Anyone resumes a released key, and completes it.
			p = mustPhase(t, ctx, s, acq("k", "o3"))
			if string(p.Progress()) != "p2" || p.Tries() != 1 {
				t.Fatalf("after Release: progress %q tries %d; want p2, 1", p.Progress(), p.Tries())
			}
			if err := f.effect(ctx, p.Tx(), "completed"); err != nil {
				t.Fatal(err)
			}
			f.set(time.Minute)
			body := []byte("done\x00\xff")
			resp := idempotency.Response{Status: 201, Header: http.Header{"X-A": {"1", "2"}}, Body: body}
			if err := p.Complete(ctx, resp); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			r, ok := f.row(t, ctx, "k")
			switch {
			case !ok:
				t.Fatal("completed key: no row")
			case r.state != "completed" || r.status == nil || *r.status != 201 || !bytes.Equal(r.body, body):
				t.Fatalf("completed row: state %q status %v body %q", r.state, r.status, r.body)
			case r.progress != nil || r.owner != nil || r.leaseEnds != nil || r.tries != 0:
				t.Fatalf("completed row keeps progress %q owner %v lease %v tries %d; want all cleared", r.progress, r.owner, r.leaseEnds, r.tries)
			case !r.created.Equal(at(0)) || !r.expires.Equal(at(time.Minute+time.Hour)):
				t.Fatalf("completed row: created %v expires %v; want %v, %v", r.created, r.expires, at(0), at(time.Minute+time.Hour))
			}
			testkit.MustCount(t, ctx, f.count, "completed", 1)

			// A live completed key is returned by Acquire, and replayed by Do.
			p, rec, err := s.Acquire(ctx, acq("k", "o4"))
			if err != nil || p != nil || rec == nil || rec.Status != 201 || !bytes.Equal(rec.Body, body) ||
				strings.Join(rec.Header["X-A"], ",") != "1,2" || rec.Fingerprint != "fp" || !rec.CreatedAt.Equal(at(0)) {
				t.Fatalf("Acquire of a completed key: got %v, %+v, %v", p, rec, err)
			}
			g := f.guard(t, &idempotency.Config{TTL: time.Hour})
			got, err := g.Do(ctx, idempotency.Key{Scope: "s", ID: "k"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 500}, f.effect(ctx, tx, "do")
			})
			if err != nil || !got.Replayed || got.Status != 201 || !bytes.Equal(got.Body, body) {
				t.Fatalf("Do on the completed operation: got %+v, %v; want the replay", got, err)
			}
			testkit.MustCount(t, ctx, f.count, "do", 0)
		})
	}
}

// TestAcquireNewKeyRollbackAndExpired: a new key's Rollback leaves no row
// and frees the key; an expired record is replaced by the operation's row
// when it saves.
func TestAcquireNewKeyRollbackAndExpired(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newStepFixture(t, postgres.Config{}, 3)
	s := f.store
	p := mustPhase(t, ctx, s, acq("n", "o1"))
	mustInProgress(t, ctx, s, acq("n", "o2")) // held by the open transaction
	if err := f.effect(ctx, p.Tx(), "gone"); err != nil {
		t.Fatal(err)
	}
	if err := p.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.row(t, ctx, "n"); ok {
		t.Fatal("a rolled-back new key left a row")
	}
	testkit.MustCount(t, ctx, f.count, "gone", 0)
	p = mustPhase(t, ctx, s, acq("n", "o2"))
	if p.Progress() != nil {
		t.Fatalf("new key again: progress %q", p.Progress())
	}
	_ = p.Rollback(ctx)

	// An expired completed record.
	g := f.guard(t, &idempotency.Config{TTL: time.Minute})
	key := idempotency.Key{Scope: "s", ID: "e"}
	if _, err := g.Do(ctx, key, "old", func(tx pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 200, Body: []byte("old")}, f.effect(ctx, tx, "old")
	}); err != nil {
		t.Fatal(err)
	}
	f.set(2 * time.Minute)
	p = mustPhase(t, ctx, s, acq("e", "o1"))
	if p.Progress() != nil || p.Fingerprint() != "fp" {
		t.Fatalf("expired key: progress %q fp %q; want nil, fp", p.Progress(), p.Fingerprint())
	}
	if err := p.Save(ctx, []byte{}); err != nil {
		t.Fatalf("Save of empty progress over an expired record: %v", err)
	}
	r := f.mustUnfinished(t, ctx, "e", "", "o1", at(2*time.Minute+10*time.Second), 0)
	if r.fp != "fp" || !r.created.Equal(at(2*time.Minute)) {
		t.Fatalf("row over the expired record: fp %q created %v", r.fp, r.created)
	}
	// Do treats it as held, and runs nothing.
	if _, err := g.Do(ctx, key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 200}, f.effect(ctx, tx, "do")
	}); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("Do on an unfinished key: %v, want ErrInProgress", err)
	}
	testkit.MustCount(t, ctx, f.count, "do", 0)
}

// TestAcquireValidation: bad input is refused with ErrInvalidConfig before
// anything is written; a bad progress rolls the phase back.
func TestAcquireValidation(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newStepFixture(t, postgres.Config{}, 2)
	s := f.store
	for name, a := range map[string]backend.Acquisition{
		"empty owner":     acq("v", ""),
		"long owner":      acq("v", strings.Repeat("o", 65)),
		"control byte":    acq("v", "o\n"),
		"non-ASCII owner": acq("v", "ö"),
		"zero lease":      func() backend.Acquisition { a := acq("v", "o"); a.Lease = 0; return a }(),
		"short lease":     func() backend.Acquisition { a := acq("v", "o"); a.Lease = time.Millisecond - 1; return a }(),
	} {
		if p, rec, err := s.Acquire(ctx, a); !errors.Is(err, idempotency.ErrInvalidConfig) || p != nil || rec != nil {
			t.Errorf("%s: got %v, %v, %v; want ErrInvalidConfig", name, p, rec, err)
		}
	}
	mustPhase(t, ctx, s, acq("v", strings.Repeat("o", 64))).Rollback(ctx)
	for name, progress := range map[string][]byte{"nil": nil, "too long": make([]byte, backend.MaxProgressLen+1)} {
		p := mustPhase(t, ctx, s, acq("v", "o"))
		if err := f.effect(ctx, p.Tx(), "bad"); err != nil {
			t.Fatal(err)
		}
		if err := p.Save(ctx, progress); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("Save of %s progress: %v, want ErrInvalidConfig", name, err)
		}
		if _, ok := f.row(t, ctx, "v"); ok {
			t.Fatalf("Save of %s progress wrote a row", name)
		}
		testkit.MustCount(t, ctx, f.count, "bad", 0)
	}
	p := mustPhase(t, ctx, s, acq("v", "o"))
	if err := p.Save(ctx, make([]byte, backend.MaxProgressLen)); err != nil {
		t.Fatalf("Save of MaxProgressLen bytes: %v", err)
	}
	if r, _ := f.row(t, ctx, "v"); len(r.progress) != backend.MaxProgressLen {
		t.Fatalf("progress of %d bytes stored, want %d", len(r.progress), backend.MaxProgressLen)
	}
	for _, q := range []backend.AbandonedQuery{{Limit: 0, MaxTries: 1}, {Limit: 1001, MaxTries: 1}, {Limit: 1, Grace: -1, MaxTries: 1}} {
		if _, err := s.Abandoned(ctx, q); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("Abandoned(%+v): %v, want ErrInvalidConfig", q, err)
		}
	}
}

// TestAcquireAbandonedConcurrently: of 20 owners acquiring one abandoned
// key at once, exactly one gets a phase. The others get ErrInProgress at
// once (no wait), or after waiting for the winner, who saved its lease
// (under SERIALIZABLE a waiter's snapshot predates the save: it gets
// ErrConflict, which the core retries).
func TestAcquireAbandonedConcurrently(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  postgres.Config
		wait time.Duration
	}{
		{"NoWait", postgres.Config{}, 0},
		{"Wait", postgres.Config{}, 5 * time.Second},
		{"SerializableNoWait", postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}, 0},
		{"SerializableWait", postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}, 5 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testkit.Context(t, testTimeout)
			const n = 20
			f := newStepFixture(t, c.cfg, n+2)
			p := mustPhase(t, ctx, f.store, acq("a", "first"))
			if err := p.Release(ctx, []byte("p")); err != nil {
				t.Fatal(err)
			}
			f.set(time.Minute)
			var (
				phases, inProgress, conflicts atomic.Int32
				others                        sync.WaitGroup
			)
			others.Add(n - 1)
			testkit.Together(n, func(i int) {
				a := acq("a", "owner"+string(rune('A'+i)))
				a.Wait = c.wait
				p, rec, err := f.store.Acquire(ctx, a)
				switch {
				case p != nil:
					if phases.Add(1) != 1 {
						_ = p.Rollback(ctx)
						others.Done()
						return
					}
					if err := f.effect(ctx, p.Tx(), "won"); err != nil {
						t.Error(err)
					}
					if c.wait == 0 {
						others.Wait() // hold the key until every other caller returned
					} else {
						time.Sleep(300 * time.Millisecond) // let the others queue for the lock
					}
					if err := p.Save(ctx, []byte("saved by "+a.Owner)); err != nil {
						t.Errorf("winner's Save: %v", err)
					}
					return
				case errors.Is(err, idempotency.ErrInProgress) && rec == nil:
					inProgress.Add(1)
				case errors.Is(err, backend.ErrConflict) && c.cfg.TxOptions.IsoLevel == pgx.Serializable && c.wait > 0:
					conflicts.Add(1)
				default:
					t.Errorf("Acquire: got %v, %v, %v", p, rec, err)
				}
				others.Done()
			})
			if phases.Load() != 1 || inProgress.Load()+conflicts.Load() != n-1 {
				t.Fatalf("%d phases, %d ErrInProgress, %d ErrConflict; want 1 and %d others", phases.Load(), inProgress.Load(), conflicts.Load(), n-1)
			}
			if c.cfg.TxOptions.IsoLevel != pgx.Serializable && inProgress.Load() != n-1 {
				t.Fatalf("%d ErrInProgress, want %d", inProgress.Load(), n-1)
			}
			testkit.MustCount(t, ctx, f.count, "won", 1)
			r, _ := f.row(t, ctx, "a")
			if r.owner == nil || "saved by "+*r.owner != string(r.progress) || r.tries != 1 {
				t.Fatalf("row after the race: owner %v progress %q tries %d", r.owner, r.progress, r.tries)
			}
		})
	}
}

// TestAcquireNewKeyConcurrently: 20 callers acquire one new key at once,
// waiting. Each one that gets a phase holds it alone and rolls back, so
// every caller gets it in turn; then, when the winner saves, the others
// find its live lease.
func TestAcquireNewKeyConcurrently(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	const n = 20
	f := newStepFixture(t, postgres.Config{}, n+2)
	var active, maxActive, phases, inProgress atomic.Int32
	run := func(id string, save bool) {
		testkit.Together(n, func(i int) {
			a := acq(id, "owner"+string(rune('A'+i)))
			a.Wait = 10 * time.Second
			p, rec, err := f.store.Acquire(ctx, a)
			if p == nil {
				if errors.Is(err, idempotency.ErrInProgress) && rec == nil {
					inProgress.Add(1)
				} else {
					t.Errorf("Acquire: got %v, %v, %v", p, rec, err)
				}
				return
			}
			phases.Add(1)
			if m := active.Add(1); m > maxActive.Load() {
				maxActive.Store(m)
			}
			if err := f.effect(ctx, p.Tx(), id); err != nil {
				t.Error(err)
			}
			time.Sleep(10 * time.Millisecond)
			active.Add(-1)
			if save {
				err = p.Save(ctx, []byte("p"))
			} else {
				err = p.Rollback(ctx)
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	run("rolled", false)
	if phases.Load() != n || maxActive.Load() != 1 || inProgress.Load() != 0 {
		t.Fatalf("rollbacks: %d phases (at most %d at once), %d ErrInProgress; want %d, 1, 0", phases.Load(), maxActive.Load(), inProgress.Load(), n)
	}
	testkit.MustCount(t, ctx, f.count, "rolled", 0)
	if _, ok := f.row(t, ctx, "rolled"); ok {
		t.Fatal("rolled-back key has a row")
	}
	phases.Store(0)
	maxActive.Store(0)
	run("saved", true)
	if phases.Load() != 1 || inProgress.Load() != n-1 {
		t.Fatalf("saves: %d phases, %d ErrInProgress; want 1, %d", phases.Load(), inProgress.Load(), n-1)
	}
	testkit.MustCount(t, ctx, f.count, "saved", 1)
}

// TestReserveUnfinishedKey: Reserve and Do treat an unfinished key as held
// (ErrInProgress, waiting or not, with the look-up first or not, under
// both ways of reserving), and a new key held by a phase as well.
func TestReserveUnfinishedKey(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  postgres.Config
	}{
		{"ReadCommitted", postgres.Config{Lookup: backend.LookupNever}},
		{"LookupFirst", postgres.Config{Lookup: backend.LookupAlways}},
		{"Serializable", postgres.Config{Lookup: backend.LookupNever, TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testkit.Context(t, testTimeout)
			f := newStepFixture(t, c.cfg, 3)
			p := mustPhase(t, ctx, f.store, acq("u", "o"))
			if err := p.Release(ctx, []byte("p")); err != nil {
				t.Fatal(err)
			}
			f.set(time.Hour)
			for _, wait := range []time.Duration{0, 200 * time.Millisecond} {
				r := backend.Reservation{Key: idempotency.Key{Scope: "s", ID: "u"}, Fingerprint: "fp", TTL: time.Hour, Wait: wait}
				txn, rec, err := f.store.Reserve(ctx, r)
				if !errors.Is(err, idempotency.ErrInProgress) || txn != nil || rec != nil {
					if txn != nil {
						_ = txn.Rollback(ctx)
					}
					t.Fatalf("Reserve (wait %v) of an unfinished key: got %v, %v, %v; want ErrInProgress", wait, txn, rec, err)
				}
			}
			g := f.guard(t, &idempotency.Config{TTL: time.Hour, WaitTimeout: 300 * time.Millisecond})
			if _, err := g.Do(ctx, idempotency.Key{Scope: "s", ID: "u"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 200}, f.effect(ctx, tx, "do")
			}); !errors.Is(err, idempotency.ErrInProgress) {
				t.Fatalf("Do on an unfinished key: %v, want ErrInProgress", err)
			}
			f.mustUnfinished(t, ctx, "u", "p", "", at(0), 1)

			// A new key held by a phase's open transaction.
			p = mustPhase(t, ctx, f.store, acq("held", "o"))
			defer p.Rollback(ctx)
			r := backend.Reservation{Key: idempotency.Key{Scope: "s", ID: "held"}, Fingerprint: "fp", TTL: time.Hour}
			if txn, rec, err := f.store.Reserve(ctx, r); !errors.Is(err, idempotency.ErrInProgress) || txn != nil || rec != nil {
				t.Fatalf("Reserve of a key held by a phase: got %v, %v, %v; want ErrInProgress", txn, rec, err)
			}
			testkit.MustCount(t, ctx, f.count, "do", 0)
		})
	}
}

// TestPurgeSkipsUnfinished: with every record expired around them, Purge
// deletes the records and never an unfinished key, whose expiry is
// MaxExpiry.
func TestPurgeSkipsUnfinished(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newStepFixture(t, postgres.Config{}, 3)
	g := f.guard(t, &idempotency.Config{TTL: time.Minute})
	for _, id := range []string{"a", "b", "c"} {
		if _, err := g.Do(ctx, idempotency.Key{Scope: "s", ID: id}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 200}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	p := mustPhase(t, ctx, f.store, acq("released", "o"))
	if err := p.Release(ctx, []byte("p")); err != nil {
		t.Fatal(err)
	}
	p = mustPhase(t, ctx, f.store, acq("leased", "o"))
	if err := p.Save(ctx, []byte("q")); err != nil {
		t.Fatal(err)
	}
	f.set(10000 * 24 * time.Hour) // far past every expiry and lease
	if n, err := f.store.Purge(ctx, 100); err != nil || n != 3 {
		t.Fatalf("Purge: got %d, %v; want 3", n, err)
	}
	f.mustUnfinished(t, ctx, "released", "p", "", at(0), 1)
	f.mustUnfinished(t, ctx, "leased", "q", "o", at(10*time.Second), 0)
	if n, err := f.store.Purge(ctx, 100); err != nil || n != 0 {
		t.Fatalf("Purge again: got %d, %v; want 0", n, err)
	}
}

// TestAbandoned lists the unfinished keys whose lease ended at least Grace
// ago and whose tries are under MaxTries, longest ended first, up to Limit.
func TestAbandoned(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newStepFixture(t, postgres.Config{}, 3)
	g := f.guard(t, &idempotency.Config{TTL: time.Minute})
	if _, err := g.Do(ctx, idempotency.Key{Scope: "s", ID: "completed"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 200}, nil
	}); err != nil {
		t.Fatal(err)
	}
	// released at 1s (1 try), 2s (2 tries), 3s (1 try); saved at 4s with
	// a 10s lease; saved at 0s, whose lease ended at 10s.
	release := func(id string, when time.Duration, tries int) {
		for range tries {
			f.set(when)
			p := mustPhase(t, ctx, f.store, acq(id, "o"))
			if err := p.Release(ctx, []byte("progress of "+id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	release("one", time.Second, 1)
	release("two", 2*time.Second, 2)
	release("three", 3*time.Second, 1)
	f.set(4 * time.Second)
	if err := mustPhase(t, ctx, f.store, acq("live", "o")).Save(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	f.set(0)
	if err := mustPhase(t, ctx, f.store, acq("ended", "o")).Save(ctx, []byte("y")); err != nil {
		t.Fatal(err)
	}
	ids := func(q backend.AbandonedQuery) string {
		t.Helper()
		keys, err := f.store.Abandoned(ctx, q)
		if err != nil {
			t.Fatalf("Abandoned(%+v): %v", q, err)
		}
		var out []string
		for _, k := range keys {
			out = append(out, k.Key.ID)
		}
		return strings.Join(out, ",")
	}
	f.set(12 * time.Second)
	for _, c := range []struct {
		q    backend.AbandonedQuery
		want string
	}{
		{backend.AbandonedQuery{MaxTries: 10, Limit: 10}, "one,two,three,ended"},
		{backend.AbandonedQuery{MaxTries: 2, Limit: 10}, "one,three,ended"},
		{backend.AbandonedQuery{MaxTries: 10, Limit: 2}, "one,two"},
		{backend.AbandonedQuery{Grace: 10 * time.Second, MaxTries: 10, Limit: 10}, "one,two"},
		{backend.AbandonedQuery{Grace: 11 * time.Second, MaxTries: 10, Limit: 10}, "one"},
		{backend.AbandonedQuery{MaxTries: 0, Limit: 10}, ""},
	} {
		if got := ids(c.q); got != c.want {
			t.Errorf("Abandoned(%+v) = %q, want %q", c.q, got, c.want)
		}
	}
	keys, err := f.store.Abandoned(ctx, backend.AbandonedQuery{MaxTries: 10, Limit: 1, Grace: 10500 * time.Millisecond})
	if err != nil || len(keys) != 1 {
		t.Fatalf("Abandoned: %v, %v", keys, err)
	}
	k := keys[0]
	if k.Key != (idempotency.Key{Scope: "s", ID: "one"}) || k.Fingerprint != "fp" || string(k.Progress) != "progress of one" ||
		k.Tries != 1 || !k.LeaseEnded.Equal(at(time.Second)) {
		t.Fatalf("Abandoned key: %+v", k)
	}
}

// TestPhaseEffects: the writes of a phase through Tx commit with Save,
// Release and Complete, and vanish with Rollback, on a new key and on an
// unfinished one.
func TestPhaseEffects(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newStepFixture(t, postgres.Config{}, 2)
	end := map[string]func(backend.Phase[pgx.Tx]) error{
		"save":     func(p backend.Phase[pgx.Tx]) error { return p.Save(ctx, []byte("s")) },
		"release":  func(p backend.Phase[pgx.Tx]) error { return p.Release(ctx, []byte("r")) },
		"complete": func(p backend.Phase[pgx.Tx]) error { return p.Complete(ctx, idempotency.Response{Status: 204}) },
		"rollback": func(p backend.Phase[pgx.Tx]) error { return p.Rollback(ctx) },
	}
	for name, fn := range end {
		for _, resumed := range []bool{false, true} {
			id := name
			if resumed {
				id += "-resumed"
				if err := mustPhase(t, ctx, f.store, acq(id, "o")).Release(ctx, []byte("start")); err != nil {
					t.Fatal(err)
				}
			}
			p := mustPhase(t, ctx, f.store, acq(id, "o"))
			for range 2 {
				if err := f.effect(ctx, p.Tx(), id); err != nil {
					t.Fatal(err)
				}
			}
			if err := fn(p); err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			want := 2
			if name == "rollback" {
				want = 0
			}
			testkit.MustCount(t, ctx, f.count, id, want)
			if _, err := p.Tx().Exec(ctx, "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
				t.Fatalf("%s: Tx after the phase: %v, want pgx.ErrTxClosed", id, err)
			}
		}
	}
}

// v010Schema is the DDL of the keys table of v0.1.0 (commit 08bdc8f).
func v010Schema(table, quoted string) string {
	return `CREATE TABLE IF NOT EXISTS ` + quoted + ` (
	scope       TEXT COLLATE "C" NOT NULL,
	id          TEXT COLLATE "C" NOT NULL,
	fingerprint TEXT NOT NULL,
	state       TEXT NOT NULL CHECK (state IN ('pending', 'completed')),
	status      INTEGER,
	header      BYTEA,
	body        BYTEA,
	created_at  TIMESTAMPTZ NOT NULL,
	expires_at  TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (scope, id)
);
CREATE INDEX IF NOT EXISTS "` + table + `_expires_at_idx" ON ` + quoted + ` (expires_at);
`
}

// TestMigrateFromV010: Do and Purge work on a table of v0.1.0; Migrate
// upgrades it (twice, then from 4 goroutines at once); its old record
// still replays and an operation runs.
func TestMigrateFromV010(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	pool := newPool(t, 6)
	table := testkit.Name("idem_v010_")
	effects := table + "_effects"
	pgkit.DropAtCleanup(t, testenv.PostgresDSN(t), "TABLE", table, effects)
	if _, err := pool.Exec(ctx, v010Schema(table, `"`+table+`"`)); err != nil {
		t.Fatalf("v0.1.0 DDL: %v", err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+effects+" (tag TEXT)"); err != nil {
		t.Fatal(err)
	}
	f := &fixture{pool: pool, table: table, effects: effects}
	s, err := postgres.New(pool, &postgres.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	f.store = s
	g := f.guard(t, &idempotency.Config{TTL: time.Hour})
	key := idempotency.Key{Scope: "s", ID: "old"}
	fn := func(tx pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201, Body: []byte("old body")}, f.effect(ctx, tx, "old")
	}
	for range 2 { // runs, then replays, on the old table
		if _, err := g.Do(ctx, key, "fp", fn); err != nil {
			t.Fatalf("Do on a v0.1.0 table: %v", err)
		}
	}
	testkit.MustCount(t, ctx, f.count, "old", 1)
	if n, err := s.Purge(ctx, 10); err != nil || n != 0 {
		t.Fatalf("Purge on a v0.1.0 table: %d, %v", n, err)
	}
	if _, _, err := s.Acquire(ctx, acq("op", "o")); err == nil {
		t.Fatal("Acquire on a v0.1.0 table succeeded")
	}

	for range 2 {
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	errs := make([]error, 4)
	testkit.Together(4, func(i int) { errs[i] = s.Migrate(ctx) })
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent Migrate: %v", err)
	}
	var cols, idx int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_name = $1`, table).Scan(&cols); err != nil || cols != 13 {
		t.Fatalf("columns after Migrate: %d, %v; want 13", cols, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexname = $2`, table, table+"_lease_ends_idx").Scan(&idx); err != nil || idx != 1 {
		t.Fatalf("lease_ends index after Migrate: %d, %v; want 1", idx, err)
	}
	var tries int
	if err := pool.QueryRow(ctx, `SELECT tries FROM "`+table+`" WHERE id = 'old'`).Scan(&tries); err != nil || tries != 0 {
		t.Fatalf("old row's tries: %d, %v; want 0", tries, err)
	}
	got, err := g.Do(ctx, key, "fp", fn)
	if err != nil || !got.Replayed || got.Status != 201 || string(got.Body) != "old body" {
		t.Fatalf("old record after Migrate: %+v, %v; want the replay", got, err)
	}
	testkit.MustCount(t, ctx, f.count, "old", 1)
	p := mustPhase(t, ctx, s, acq("op", "o"))
	if err := f.effect(ctx, p.Tx(), "op"); err != nil {
		t.Fatal(err)
	}
	if err := p.Save(ctx, []byte("p")); err != nil {
		t.Fatal(err)
	}
	p = mustPhase(t, ctx, s, acq("op", "o"))
	if string(p.Progress()) != "p" {
		t.Fatalf("resumed progress %q", p.Progress())
	}
	if err := p.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("op")}); err != nil {
		t.Fatal(err)
	}
	testkit.MustCount(t, ctx, f.count, "op", 1)
	if _, rec, err := s.Acquire(ctx, acq("op", "o")); err != nil || rec == nil || string(rec.Body) != "op" {
		t.Fatalf("completed operation: %v, %v", rec, err)
	}
}

// TestPgBouncerSteps runs every primitive of multi-step operations and of
// key administration, from two pools built as the README builds one
// (pgx's statement cache as their default), through a PgBouncer in
// transaction mode whose two server connections they share: a named
// prepared statement or session state of the store would break a later
// transaction on the other pool. The phases' own writes name a mode safe
// behind the pooler, as docs/deployments.md says fn's must.
func TestPgBouncerSteps(t *testing.T) {
	dsn := startPgBouncer(t, bouncerOptions{PoolSize: 2, Lifetime: 60})
	ctx := testkit.Context(t, 60*time.Second)
	f := newFixture(t, newPool(t, 2), postgres.Config{})
	var stores []*postgres.Store
	for _, serializable := range []bool{false, true} {
		cfg := postgres.Config{Table: f.table}
		if serializable {
			cfg.TxOptions.IsoLevel = pgx.Serializable
		}
		s, err := postgres.New(bouncerPool(t, dsn, 2), &cfg)
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	effect := func(p backend.Phase[pgx.Tx], tag string) {
		t.Helper()
		if _, err := p.Tx().Exec(ctx, "INSERT INTO "+f.effects+" (tag) VALUES ($1)", pgx.QueryExecModeExec, tag); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		s, other := stores[i%2], stores[(i+1)%2]
		id := testkit.Name("op-")
		key := idempotency.Key{Scope: "s", ID: id}
		a := acq(id, "o1")
		a.Lease = time.Millisecond
		p := mustPhase(t, ctx, s, a)
		effect(p, id)
		if err := p.Save(ctx, []byte("p1")); err != nil {
			t.Fatalf("Save: %v", err)
		}
		time.Sleep(5 * time.Millisecond) // the lease ends
		p = mustPhase(t, ctx, other, acq(id, "o2"))
		if string(p.Progress()) != "p1" {
			t.Fatalf("progress %q, want p1", p.Progress())
		}
		if in, err := s.Inspect(ctx, key, false); err != nil || in.State != backend.KeyInProgress {
			t.Fatalf("Inspect of a key held by a phase: %+v, %v", in, err)
		}
		if _, err := s.Forget(ctx, key); !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("Forget of a key held by a phase: %v, want ErrInProgress", err)
		}
		effect(p, id)
		if err := p.Release(ctx, []byte("p2")); err != nil {
			t.Fatalf("Release: %v", err)
		}
		keys, err := other.Abandoned(ctx, backend.AbandonedQuery{MaxTries: 100, Limit: 1000})
		if err != nil || !slicesContainKey(keys, key) {
			t.Fatalf("Abandoned: %v, %v; want %v listed", keys, err, key)
		}
		if page, err := s.List(ctx, backend.ListQuery{Scope: "s", Limit: 1000}); err != nil || len(page.Keys) != i+1 {
			t.Fatalf("List: %d keys, %v; want %d", len(page.Keys), err, i+1)
		}
		if st, err := other.Stats(ctx); err != nil || st.Unfinished != 1 || st.Completed != int64(i) {
			t.Fatalf("Stats: %+v, %v", st, err)
		}
		p = mustPhase(t, ctx, s, acq(id, "o3"))
		effect(p, id)
		if err := p.Complete(ctx, idempotency.Response{Status: 200, Body: []byte(id)}); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if _, rec, err := other.Acquire(ctx, acq(id, "o4")); err != nil || rec == nil || string(rec.Body) != id {
			t.Fatalf("Acquire of the completed key: %v, %v", rec, err)
		}
		testkit.MustCount(t, ctx, f.count, id, 3)
		tmp := testkit.Name("tmp-")
		if err := mustPhase(t, ctx, other, acq(tmp, "o")).Save(ctx, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Forget(ctx, idempotency.Key{Scope: "s", ID: tmp}); !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("Forget of a live lease: %v", err)
		}
		if _, err := f.pool.Exec(ctx, `UPDATE "`+f.table+`" SET lease_ends = lease_ends - interval '1 hour' WHERE id = $1`, tmp); err != nil {
			t.Fatal(err)
		}
		if in, err := other.Forget(ctx, idempotency.Key{Scope: "s", ID: tmp}); err != nil || in.State != backend.KeyUnfinished {
			t.Fatalf("Forget: %+v, %v", in, err)
		}
	}
}

// slicesContainKey reports whether keys lists key.
func slicesContainKey(keys []backend.AbandonedKey, key idempotency.Key) bool {
	for _, k := range keys {
		if k.Key == key {
			return true
		}
	}
	return false
}

// TestPhaseRollbackCancelled: Rollback works with a ctx already cancelled,
// frees the key and returns the connection; a phase whose step failed
// (the transaction aborted) cannot save.
func TestPhaseRollbackCancelled(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newStepFixture(t, postgres.Config{}, 1) // one connection: a leak would block the next Acquire
	if err := mustPhase(t, ctx, f.store, acq("r", "o")).Release(ctx, []byte("p")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		p := mustPhase(t, ctx, f.store, acq("r", "o"))
		if err := f.effect(ctx, p.Tx(), "cancelled"); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := p.Rollback(cctx); err != nil {
			t.Fatalf("Rollback with a cancelled ctx: %v", err)
		}
	}
	testkit.MustCount(t, ctx, f.count, "cancelled", 0)
	f.mustUnfinished(t, ctx, "r", "p", "", at(0), 1)

	p := mustPhase(t, ctx, f.store, acq("r", "o"))
	if _, err := p.Tx().Exec(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("division by zero succeeded")
	}
	if err := p.Save(ctx, []byte("after failure")); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Save after a failed statement: %v, want pgx.ErrTxCommitRollback", err)
	}
	f.mustUnfinished(t, ctx, "r", "p", "", at(0), 1)
	mustPhase(t, ctx, f.store, acq("r", "o")).Rollback(ctx)
}
