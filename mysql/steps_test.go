package mysql

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// stepVariant is a way of running the step tests: the dialect's wait
// bounds, and the DSN's prepared statements or interpolation.
type stepVariant struct {
	name    string
	dsn     func(*gomysql.Config)
	dialect dialect
}

var stepVariants = []stepVariant{
	{"MariaDB", interpolate, dialectMariaDB},
	{"Session", interpolate, dialectMySQL},
	{"Prepared", nil, dialectMariaDB},
}

// stepClock is a settable Config.Clock.
type stepClock struct{ ns atomic.Int64 }

func newStepClock() *stepClock {
	c := &stepClock{}
	c.ns.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	return c
}

func (c *stepClock) Now() time.Time           { return time.Unix(0, c.ns.Load()).UTC() }
func (c *stepClock) Add(d time.Duration)      { c.ns.Add(int64(d)) }
func (c *stepClock) At(d time.Duration) int64 { return c.ns.Load() + int64(d) }

// stepFixture is a fixture whose store runs v, with a test clock unless
// serverClock.
func stepFixture(t *testing.T, v stepVariant, maxConns int, clock *stepClock) *fixture {
	t.Helper()
	db := openDB(t, testConfig(t, v.dsn), maxConns)
	cfg := &Config{}
	if clock != nil {
		cfg.Clock = clock.Now
	}
	f := newFixture(t, db, cfg)
	f.store.dialect.Store(int32(v.dialect))
	return f
}

func forVariants(t *testing.T, fn func(t *testing.T, v stepVariant)) {
	for _, v := range stepVariants {
		t.Run(v.name, func(t *testing.T) { fn(t, v) })
	}
}

// dbRow is a key's row as the table holds it.
type dbRow struct {
	fp, state        string
	status           int
	body             []byte
	created, expires int64
	progress         []byte
	hasProgress      bool
	owner            sql.NullString
	leaseEnds        sql.NullInt64
	tries            int
}

func (f *fixture) row(t testing.TB, ctx context.Context, k idempotency.Key) (dbRow, bool) {
	t.Helper()
	var r dbRow
	err := f.db.QueryRowContext(ctx, "SELECT fingerprint, state, status, body, created_at, expires_at, progress, progress IS NOT NULL, owner, lease_ends, tries FROM `"+f.table+"` WHERE scope = ? AND id = ?",
		[]byte(k.Scope), []byte(k.ID)).Scan(&r.fp, &r.state, &r.status, &r.body, &r.created, &r.expires, &r.progress, &r.hasProgress, &r.owner, &r.leaseEnds, &r.tries)
	if errors.Is(err, sql.ErrNoRows) {
		return dbRow{}, false
	}
	if err != nil {
		t.Fatalf("read row: %v", err)
	}
	return r, true
}

func (f *fixture) rows(t testing.TB, ctx context.Context) int {
	t.Helper()
	var n int
	if err := f.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+f.table+"`").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func acquisition(k idempotency.Key, owner string, wait time.Duration) backend.Acquisition {
	return backend.Acquisition{
		Reservation: backend.Reservation{Key: k, Fingerprint: "fp-" + k.ID, TTL: time.Hour, Wait: wait},
		Owner:       owner,
		Lease:       10 * time.Second,
	}
}

func newKey(id string) idempotency.Key { return idempotency.Key{Scope: "steps", ID: id} }

// mustAcquire acquires a phase or fails the test.
func mustAcquire(t testing.TB, ctx context.Context, s *Store, a backend.Acquisition) backend.Phase[*sql.Tx] {
	t.Helper()
	p, rec, err := s.Acquire(ctx, a)
	if err != nil || rec != nil || p == nil {
		t.Fatalf("Acquire(%v, %s): phase %v, record %v, %v", a.Key, a.Owner, p, rec, err)
	}
	return p
}

// unfinished commits an unfinished key with progress, released (lease
// ended, one try) unless leased.
func unfinished(t testing.TB, ctx context.Context, f *fixture, k idempotency.Key, progress string, leased bool) {
	t.Helper()
	p := mustAcquire(t, ctx, f.store, acquisition(k, "setup", 0))
	save := p.Release
	if leased {
		save = p.Save
	}
	if err := save(ctx, []byte(progress)); err != nil {
		t.Fatalf("commit %v: %v", k, err)
	}
}

// TestStepsLifecycle walks one key through every primitive, with the test
// clock, checking the row after each commit: a new key's Save, the same
// owner's and another owner's Acquire, Release, Complete, then the replay.
func TestStepsLifecycle(t *testing.T) {
	forVariants(t, func(t *testing.T, v stepVariant) {
		ctx := testkit.Context(t, 30*time.Second)
		clock := newStepClock()
		f := stepFixture(t, v, 0, clock)
		s := f.store
		k := newKey("life")
		start := clock.ns.Load()

		p := mustAcquire(t, ctx, s, acquisition(k, "owner-1", 0))
		if p.Progress() != nil || p.Tries() != 0 || p.Fingerprint() != "fp-life" {
			t.Fatalf("new key: progress %q, tries %d, fingerprint %q", p.Progress(), p.Tries(), p.Fingerprint())
		}
		if err := f.fx.Effect(ctx, p.Tx(), "step1"); err != nil {
			t.Fatal(err)
		}
		if err := p.Save(ctx, []byte("at step 2\x00\xff")); err != nil {
			t.Fatalf("Save: %v", err)
		}
		r, ok := f.row(t, ctx, k)
		want := dbRow{fp: "fp-life", state: "pending", created: start, expires: math.MaxInt64, progress: []byte("at step 2\x00\xff"), hasProgress: true,
			owner: sql.NullString{String: "owner-1", Valid: true}, leaseEnds: sql.NullInt64{Int64: start + int64(10*time.Second), Valid: true}}
		if !ok || fmt.Sprint(r) != fmt.Sprint(want) {
			t.Fatalf("after Save: row %+v (found %v), want %+v", r, ok, want)
		}
		testkit.MustCount(t, ctx, f.fx.Count, "step1", 1)

		// The same owner takes its own live lease back; the same progress
		// saved again at the same clock changes no column.
		clock.Add(time.Second)
		p = mustAcquire(t, ctx, s, acquisition(k, "owner-1", 0))
		if !bytes.Equal(p.Progress(), []byte("at step 2\x00\xff")) || p.Tries() != 0 || p.Fingerprint() != "fp-life" {
			t.Fatalf("own lease: progress %q, tries %d, fingerprint %q", p.Progress(), p.Tries(), p.Fingerprint())
		}
		if err := p.Save(ctx, []byte("at step 2\x00\xff")); err != nil {
			t.Fatalf("Save unchanged: %v", err)
		}
		p = mustAcquire(t, ctx, s, acquisition(k, "owner-1", 0))
		if err := f.fx.Effect(ctx, p.Tx(), "step2-failed"); err != nil {
			t.Fatal(err)
		}
		if err := p.Release(ctx, []byte("failed at 2")); err != nil {
			t.Fatalf("Release: %v", err)
		}
		r, _ = f.row(t, ctx, k)
		if r.owner.Valid || r.leaseEnds.Int64 != clock.At(0) || r.tries != 1 || string(r.progress) != "failed at 2" || r.expires != math.MaxInt64 || r.created != start {
			t.Fatalf("after Release: %+v", r)
		}
		testkit.MustCount(t, ctx, f.fx.Count, "step2-failed", 1)

		// Another owner takes the ended lease over.
		p = mustAcquire(t, ctx, s, acquisition(k, "owner-2", 0))
		if string(p.Progress()) != "failed at 2" || p.Tries() != 1 {
			t.Fatalf("takeover: progress %q, tries %d", p.Progress(), p.Tries())
		}
		if err := f.fx.Effect(ctx, p.Tx(), "step2"); err != nil {
			t.Fatal(err)
		}
		clock.Add(time.Minute)
		resp := idempotency.Response{Status: 201, Header: map[string][]string{"X-A": {"1", "2"}}, Body: []byte("done\x00")}
		if err := p.Complete(ctx, resp); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		r, _ = f.row(t, ctx, k)
		if r.state != "completed" || r.hasProgress || r.owner.Valid || r.leaseEnds.Valid || r.tries != 0 || r.created != start ||
			r.expires != clock.At(time.Hour) || r.status != 201 || string(r.body) != "done\x00" {
			t.Fatalf("after Complete: %+v", r)
		}
		testkit.MustCount(t, ctx, f.fx.Count, "step2", 1)

		for _, owner := range []string{"owner-2", "owner-3"} {
			p, rec, err := s.Acquire(ctx, acquisition(k, owner, 0))
			if err != nil || p != nil || rec == nil || rec.Status != 201 || string(rec.Body) != "done\x00" || rec.Header.Get("X-A") != "1" ||
				rec.CreatedAt.UnixNano() != start || rec.Fingerprint != "fp-life" {
				t.Fatalf("Acquire of the completed key: %v %+v %v", p, rec, err)
			}
		}
		txn, rec, err := s.Reserve(ctx, backend.Reservation{Key: k, Fingerprint: "other", TTL: time.Hour})
		if err != nil || txn != nil || rec == nil || string(rec.Body) != "done\x00" {
			t.Fatalf("Reserve of the completed key: %v %+v %v", txn, rec, err)
		}
		// Expired: a new key again, taken over.
		clock.Add(2 * time.Hour)
		p = mustAcquire(t, ctx, s, acquisition(k, "owner-4", 0))
		if p.Progress() != nil || p.Tries() != 0 {
			t.Fatalf("expired key: progress %q, tries %d", p.Progress(), p.Tries())
		}
		if err := p.Save(ctx, []byte{}); err != nil {
			t.Fatal(err)
		}
		r, _ = f.row(t, ctx, k)
		if r.created != clock.At(0) || !r.hasProgress || len(r.progress) != 0 || r.state != "pending" || r.status != 0 || r.body != nil {
			t.Fatalf("after the takeover's Save: %+v", r)
		}
		p = mustAcquire(t, ctx, s, acquisition(k, "owner-4", 0))
		if p.Progress() == nil || len(p.Progress()) != 0 {
			t.Fatalf("an empty progress came back as %#v", p.Progress())
		}
		if err := p.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestAcquireLeasedToOther: a live lease of another owner is reported at
// once, whatever the wait; once it ends (by the store's clock) the key is
// taken over.
func TestAcquireLeasedToOther(t *testing.T) {
	forVariants(t, func(t *testing.T, v stepVariant) {
		ctx := testkit.Context(t, 30*time.Second)
		clock := newStepClock()
		f := stepFixture(t, v, 0, clock)
		k := newKey("leased")
		unfinished(t, ctx, f, k, "p", true)
		for _, wait := range []time.Duration{0, 3 * time.Second} {
			began := time.Now()
			p, rec, err := f.store.Acquire(ctx, acquisition(k, "other", wait))
			if !errors.Is(err, idempotency.ErrInProgress) || p != nil || rec != nil {
				t.Fatalf("wait %v: %v %v %v", wait, p, rec, err)
			}
			if d := time.Since(began); d > time.Second {
				t.Fatalf("wait %v: reported after %v, want at once", wait, d)
			}
		}
		clock.Add(10*time.Second - time.Millisecond)
		if _, _, err := f.store.Acquire(ctx, acquisition(k, "other", 0)); !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("1ms before the lease's end: %v", err)
		}
		clock.Add(time.Millisecond)
		p := mustAcquire(t, ctx, f.store, acquisition(k, "other", 0))
		if string(p.Progress()) != "p" {
			t.Fatalf("progress %q", p.Progress())
		}
		if err := p.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		r, _ := f.row(t, ctx, k)
		if r.owner.String != "setup" || r.tries != 0 {
			t.Fatalf("Rollback changed the committed lease: %+v", r)
		}
	})
}

// TestPhaseEffects: a phase's writes through Tx commit with Save, Release
// and Complete, and vanish with Rollback, which also frees a new key and
// leaves an unfinished key as committed.
func TestPhaseEffects(t *testing.T) {
	forVariants(t, func(t *testing.T, v stepVariant) {
		ctx := testkit.Context(t, 30*time.Second)
		clock := newStepClock()
		f := stepFixture(t, v, 0, clock)
		ends := map[string]func(backend.Phase[*sql.Tx]) error{
			"save":     func(p backend.Phase[*sql.Tx]) error { return p.Save(ctx, []byte("s")) },
			"release":  func(p backend.Phase[*sql.Tx]) error { return p.Release(ctx, []byte("r")) },
			"complete": func(p backend.Phase[*sql.Tx]) error { return p.Complete(ctx, idempotency.Response{Status: 200}) },
			"rollback": func(p backend.Phase[*sql.Tx]) error { return p.Rollback(ctx) },
		}
		for name, end := range ends {
			for _, existing := range []bool{false, true} {
				k := newKey(fmt.Sprintf("%s-%v", name, existing))
				if existing {
					unfinished(t, ctx, f, k, "before", false)
				}
				before, _ := f.row(t, ctx, k)
				p := mustAcquire(t, ctx, f.store, acquisition(k, "o", 0))
				if err := f.fx.Effect(ctx, p.Tx(), k.ID); err != nil {
					t.Fatal(err)
				}
				if err := end(p); err != nil {
					t.Fatalf("%s: %v", k.ID, err)
				}
				want := 1
				if name == "rollback" {
					want = 0
				}
				testkit.MustCount(t, ctx, f.fx.Count, k.ID, want)
				after, found := f.row(t, ctx, k)
				switch {
				case name == "rollback" && !existing && found:
					t.Fatalf("a new key's Rollback left its row: %+v", after)
				case name == "rollback" && existing && fmt.Sprint(after) != fmt.Sprint(before):
					t.Fatalf("Rollback changed the unfinished row: %+v, was %+v", after, before)
				case name != "rollback" && !found:
					t.Fatalf("%s: no row", k.ID)
				}
			}
		}
	})
}

// TestStepsValidation: bad inputs are refused with ErrInvalidConfig before
// anything is written; a bad progress ends the phase without committing.
func TestStepsValidation(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	f := stepFixture(t, stepVariants[0], 0, nil)
	k := newKey("valid")
	for name, change := range map[string]func(*backend.Acquisition){
		"empty owner":    func(a *backend.Acquisition) { a.Owner = "" },
		"long owner":     func(a *backend.Acquisition) { a.Owner = strings.Repeat("o", 65) },
		"owner with NUL": func(a *backend.Acquisition) { a.Owner = "a\x00b" },
		"owner UTF-8":    func(a *backend.Acquisition) { a.Owner = "é" },
		"short lease":    func(a *backend.Acquisition) { a.Lease = time.Millisecond - 1 },
		"zero TTL":       func(a *backend.Acquisition) { a.TTL = 0 },
	} {
		a := acquisition(k, "owner", 0)
		change(&a)
		if p, rec, err := f.store.Acquire(ctx, a); !errors.Is(err, idempotency.ErrInvalidConfig) || p != nil || rec != nil {
			t.Errorf("%s: %v %v %v", name, p, rec, err)
		}
	}
	a := acquisition(k, strings.Repeat("o", 64), 0)
	for name, progress := range map[string][]byte{"nil": nil, "too long": make([]byte, backend.MaxProgressLen+1)} {
		p := mustAcquire(t, ctx, f.store, a)
		if err := f.fx.Effect(ctx, p.Tx(), "bad"); err != nil {
			t.Fatal(err)
		}
		if err := p.Save(ctx, progress); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("Save(%s progress): %v", name, err)
		}
		if err := p.Rollback(ctx); err != nil {
			t.Errorf("Rollback after the refused Save: %v", err)
		}
	}
	testkit.MustCount(t, ctx, f.fx.Count, "bad", 0)
	if n := f.rows(t, ctx); n != 0 {
		t.Fatalf("%d rows written", n)
	}
	p := mustAcquire(t, ctx, f.store, a)
	if err := p.Save(ctx, make([]byte, backend.MaxProgressLen)); err != nil {
		t.Fatalf("Save of MaxProgressLen bytes: %v", err)
	}
	for _, limit := range []int{0, -1, 1001} {
		if _, err := f.store.Abandoned(ctx, backend.AbandonedQuery{Limit: limit, MaxTries: 1}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("Abandoned limit %d: %v", limit, err)
		}
		if _, err := f.store.List(ctx, backend.ListQuery{Limit: limit}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("List limit %d: %v", limit, err)
		}
	}
	if _, err := f.store.Abandoned(ctx, backend.AbandonedQuery{Limit: 1, MaxTries: 1, Grace: -1}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("Abandoned negative grace: %v", err)
	}
}

// TestAcquireAbandonedConcurrently: 20 owners acquire one abandoned key at
// once, in 20 sessions; exactly one obtains a Phase, the others get
// ErrInProgress (at once with no wait; after waiting for the winner's Save
// with one).
func TestAcquireAbandonedConcurrently(t *testing.T) {
	forVariants(t, func(t *testing.T, v stepVariant) {
		for _, wait := range []time.Duration{0, 5 * time.Second} {
			t.Run(fmt.Sprint("wait=", wait), func(t *testing.T) {
				ctx := testkit.Context(t, 60*time.Second)
				f := stepFixture(t, v, 24, nil)
				k := newKey("abandoned")
				unfinished(t, ctx, f, k, "resume me", false)
				const n = 20
				var (
					won, busy atomic.Int32
					others    sync.WaitGroup
					errs      = make(chan error, n)
				)
				others.Add(n)
				testkit.Together(n, func(i int) {
					p, rec, err := f.store.Acquire(ctx, acquisition(k, fmt.Sprint("owner-", i), wait))
					if p == nil {
						if !errors.Is(err, idempotency.ErrInProgress) || rec != nil {
							errs <- fmt.Errorf("owner %d: record %v, %v", i, rec, err)
						}
						busy.Add(1)
						others.Done()
						return
					}
					others.Done()
					won.Add(1)
					if wait == 0 {
						others.Wait() // hold the key until every other caller answered
					} else {
						time.Sleep(300 * time.Millisecond) // the others wait for the lock
					}
					if err := f.fx.Effect(ctx, p.Tx(), "resumed"); err != nil {
						errs <- err
					}
					if err := p.Save(ctx, []byte("next")); err != nil {
						errs <- err
					}
				})
				close(errs)
				for err := range errs {
					t.Error(err)
				}
				if won.Load() != 1 || busy.Load() != n-1 {
					t.Fatalf("%d phases, %d in progress; want 1 and %d", won.Load(), busy.Load(), n-1)
				}
				testkit.MustCount(t, ctx, f.fx.Count, "resumed", 1)
				if r, _ := f.row(t, ctx, k); string(r.progress) != "next" || !strings.HasPrefix(r.owner.String, "owner-") {
					t.Fatalf("row %+v", r)
				}
			})
		}
	})
}

// TestAcquireNewKeyConcurrently: 20 callers acquire one new key at once.
// With no wait exactly one obtains a Phase and the others get
// ErrInProgress; with a wait, each holder rolls back after a while and
// the key passes on, never held by two at a time, and every caller either
// gets it or ErrInProgress.
func TestAcquireNewKeyConcurrently(t *testing.T) {
	forVariants(t, func(t *testing.T, v stepVariant) {
		for _, wait := range []time.Duration{0, 10 * time.Second} {
			t.Run(fmt.Sprint("wait=", wait), func(t *testing.T) {
				ctx := testkit.Context(t, 60*time.Second)
				f := stepFixture(t, v, 24, nil)
				k := newKey("new")
				const n = 20
				var (
					won, busy, holding atomic.Int32
					others             sync.WaitGroup
					errs               = make(chan error, 2*n)
				)
				others.Add(n)
				testkit.Together(n, func(i int) {
					p, rec, err := f.store.Acquire(ctx, acquisition(k, fmt.Sprint("owner-", i), wait))
					if p == nil {
						if !errors.Is(err, idempotency.ErrInProgress) || rec != nil {
							errs <- fmt.Errorf("caller %d: record %v, %v", i, rec, err)
						}
						busy.Add(1)
						others.Done()
						return
					}
					if h := holding.Add(1); h != 1 {
						errs <- fmt.Errorf("caller %d: %d holders at once", i, h)
					}
					won.Add(1)
					others.Done()
					if p.Progress() != nil {
						errs <- fmt.Errorf("caller %d: progress %q", i, p.Progress())
					}
					if err := f.fx.Effect(ctx, p.Tx(), "new"); err != nil {
						errs <- err
					}
					if wait == 0 {
						others.Wait()
					} else {
						time.Sleep(20 * time.Millisecond)
					}
					holding.Add(-1)
					if err := p.Rollback(ctx); err != nil {
						errs <- err
					}
				})
				close(errs)
				for err := range errs {
					t.Error(err)
				}
				if wait == 0 && (won.Load() != 1 || busy.Load() != n-1) {
					t.Fatalf("%d phases, %d in progress; want 1 and %d", won.Load(), busy.Load(), n-1)
				}
				if wait > 0 && won.Load() < 2 {
					t.Fatalf("%d phases (%d in progress): the waiters never got the key after a Rollback", won.Load(), busy.Load())
				}
				t.Logf("%d phases, %d in progress", won.Load(), busy.Load())
				testkit.MustCount(t, ctx, f.fx.Count, "new", 0)
				if n := f.rows(t, ctx); n != 0 {
					t.Fatalf("%d rows after every Rollback", n)
				}
			})
		}
	})
}

// TestReserveOnUnfinished: Reserve treats an unfinished key as held, on
// every path, with and without a wait, leased or not, and while a phase
// holds it; it never takes it over.
func TestReserveOnUnfinished(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			ctx := testkit.Context(t, 60*time.Second)
			db := openDB(t, testConfig(t, interpolate), 0)
			f := newFixture(t, db, nil)
			s := newStore(t, db, f.table, p)
			released, leased := newKey("released"), newKey("leased")
			unfinished(t, ctx, f, released, "r", false)
			unfinished(t, ctx, f, leased, "l", true)
			check := func(what string, k idempotency.Key, wait time.Duration) {
				t.Helper()
				txn, rec, err := s.Reserve(ctx, backend.Reservation{Key: k, Fingerprint: "fp", TTL: time.Hour, Wait: wait})
				if !errors.Is(err, idempotency.ErrInProgress) || txn != nil || rec != nil {
					if txn != nil {
						_ = txn.Rollback(ctx)
					}
					t.Fatalf("%s, wait %v: %v %v %v", what, wait, txn, rec, err)
				}
			}
			for _, wait := range []time.Duration{0, time.Second} {
				check("released", released, wait)
				check("leased", leased, wait)
			}
			ph := mustAcquire(t, ctx, f.store, acquisition(released, "o", 0))
			check("in a phase", released, 0)
			check("in a phase", released, time.Second)
			if err := ph.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if r, _ := f.row(t, ctx, released); string(r.progress) != "r" || r.state != "pending" || r.fp != "fp-released" {
				t.Fatalf("the unfinished row changed: %+v", r)
			}
		})
	}
}

// TestPurgeSkipsUnfinished: with every record expired around them (the
// clock 100 years on), Purge deletes the completed records and keeps the
// unfinished ones, released or leased.
func TestPurgeSkipsUnfinished(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	clock := newStepClock()
	f := stepFixture(t, stepVariants[0], 0, clock)
	for i := range 5 {
		unfinished(t, ctx, f, newKey(fmt.Sprint("u", i)), "p", i%2 == 0)
		k := newKey(fmt.Sprint("c", i))
		p := mustAcquire(t, ctx, f.store, acquisition(k, "o", 0))
		if err := p.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Add(100 * 365 * 24 * time.Hour)
	n, err := f.store.Purge(ctx, 100)
	if err != nil || n != 5 {
		t.Fatalf("Purge: %d, %v; want 5", n, err)
	}
	if n, err := f.store.Purge(ctx, 100); err != nil || n != 0 {
		t.Fatalf("second Purge: %d, %v", n, err)
	}
	for i := range 5 {
		if _, ok := f.row(t, ctx, newKey(fmt.Sprint("u", i))); !ok {
			t.Fatalf("unfinished key u%d purged", i)
		}
	}
	if n := f.rows(t, ctx); n != 5 {
		t.Fatalf("%d rows left, want 5", n)
	}
}

// TestAbandoned: only unfinished keys whose lease ended at least Grace ago
// and with fewer tries than MaxTries, the longest ended first, up to Limit.
func TestAbandoned(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	clock := newStepClock()
	f := stepFixture(t, stepVariants[0], 0, clock)
	release := func(id string, tries int) {
		for range tries {
			p := mustAcquire(t, ctx, f.store, acquisition(newKey(id), "o", 0))
			if err := p.Release(ctx, []byte("progress of "+id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	release("old", 1) // lease ended at t0
	clock.Add(time.Minute)
	release("failing", 3) // ended at t0+1m, 3 tries
	clock.Add(time.Minute)
	release("mid", 1) // ended at t0+2m
	clock.Add(time.Minute)
	unfinished(t, ctx, f, newKey("leased"), "l", true) // lease ends at t0+3m+10s
	release("recent", 1)                               // ended at t0+3m
	p := mustAcquire(t, ctx, f.store, acquisition(newKey("done"), "o", 0))
	if err := p.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	clock.Add(5 * time.Second) // now t0+3m05s: "leased" is still leased
	t0 := clock.At(-3*time.Minute - 5*time.Second)

	got := func(q backend.AbandonedQuery) string {
		t.Helper()
		keys, err := f.store.Abandoned(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, k := range keys {
			if string(k.Progress) != "progress of "+k.Key.ID || k.Fingerprint != "fp-"+k.Key.ID || k.Key.Scope != "steps" {
				t.Errorf("key %+v", k)
			}
			out = append(out, fmt.Sprintf("%s:%d@%v", k.Key.ID, k.Tries, time.Duration(k.LeaseEnded.UnixNano()-t0)))
		}
		return strings.Join(out, " ")
	}
	for _, c := range []struct {
		q    backend.AbandonedQuery
		want string
	}{
		{backend.AbandonedQuery{MaxTries: 10, Limit: 10}, "old:1@0s failing:3@1m0s mid:1@2m0s recent:1@3m0s"},
		{backend.AbandonedQuery{MaxTries: 3, Limit: 10}, "old:1@0s mid:1@2m0s recent:1@3m0s"},
		{backend.AbandonedQuery{MaxTries: 10, Limit: 2}, "old:1@0s failing:3@1m0s"},
		{backend.AbandonedQuery{MaxTries: 10, Limit: 10, Grace: 90 * time.Second}, "old:1@0s failing:3@1m0s"},
		{backend.AbandonedQuery{MaxTries: 10, Limit: 10, Grace: 5 * time.Second}, "old:1@0s failing:3@1m0s mid:1@2m0s recent:1@3m0s"},
		{backend.AbandonedQuery{MaxTries: 10, Limit: 10, Grace: 5*time.Second + time.Millisecond}, "old:1@0s failing:3@1m0s mid:1@2m0s"},
		{backend.AbandonedQuery{MaxTries: 1, Limit: 10}, ""},
	} {
		if g := got(c.q); g != c.want {
			t.Errorf("%+v: %q, want %q", c.q, g, c.want)
		}
	}
}

// v010Schema is the keys table exactly as v0.1.0's Schema created it
// (git show 08bdc8f:mysql/schema.go).
const v010Schema = "CREATE TABLE IF NOT EXISTS `%s` (\n" +
	"  scope       VARBINARY(255) NOT NULL,\n" +
	"  id          VARBINARY(255) NOT NULL,\n" +
	"  fingerprint VARBINARY(255) NOT NULL,\n" +
	"  state       VARCHAR(9) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,\n" +
	"  status      INT NOT NULL DEFAULT 0,\n" +
	"  header      LONGBLOB NULL,\n" +
	"  body        LONGBLOB NULL,\n" +
	"  created_at  BIGINT NOT NULL COMMENT 'Unix nanoseconds',\n" +
	"  expires_at  BIGINT NOT NULL COMMENT 'Unix nanoseconds',\n" +
	"  PRIMARY KEY (scope, id),\n" +
	"  KEY expires_at_idx (expires_at)\n" +
	") ENGINE=InnoDB"

// TestMigrateFromV010: on a table of the v0.1.0 schema Do (Reserve,
// Complete, Purge) works before the upgrade; Migrate, twice and from 4
// goroutines at once, adds the step columns and index; the old record
// still replays and an operation runs.
func TestMigrateFromV010(t *testing.T) {
	ctx := testkit.Context(t, 60*time.Second)
	db := openDB(t, testConfig(t, interpolate), 8)
	table := testkit.Name("idem_v010_")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+table+"`")
	})
	if _, err := db.ExecContext(ctx, fmt.Sprintf(v010Schema, table)); err != nil {
		t.Fatal(err)
	}
	s, err := New(db, &Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := idempotency.Key{ID: "old"}
	resp, err := g.Do(ctx, old, "fp", func(*sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 202, Body: []byte("from v0.1.0")}, nil
	})
	if err != nil || resp.Replayed {
		t.Fatalf("Do on the v0.1.0 table: %+v %v", resp, err)
	}
	if n, err := s.Purge(ctx, 10); err != nil || n != 0 {
		t.Fatalf("Purge on the v0.1.0 table: %d %v", n, err)
	}
	if _, _, err := s.Acquire(ctx, acquisition(newKey("early"), "o", 0)); err == nil {
		t.Fatal("Acquire worked on the v0.1.0 table")
	}

	for round := range 2 {
		errs := make([]error, 4)
		testkit.Together(4, func(i int) {
			s, err := New(db, &Config{Table: table})
			if err == nil {
				err = s.Migrate(ctx)
			}
			errs[i] = err
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, migration %d: %v", round, i, err)
			}
		}
	}
	var cols, idx int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?
AND COLUMN_NAME IN ('progress', 'owner', 'lease_ends', 'tries')`, table).Scan(&cols); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?
AND INDEX_NAME = 'lease_ends_idx'`, table).Scan(&idx); err != nil {
		t.Fatal(err)
	}
	if cols != 4 || idx != 1 {
		t.Fatalf("%d step columns, %d lease_ends index entries after Migrate", cols, idx)
	}
	if alter, err := s.missingDDL(ctx); err != nil || alter != "" {
		t.Fatalf("still missing: %q %v", alter, err)
	}

	resp, err = g.Do(ctx, old, "fp", func(*sql.Tx) (idempotency.Response, error) {
		t.Error("fn ran for the old record")
		return idempotency.Response{}, nil
	})
	if err != nil || !resp.Replayed || resp.Status != 202 || string(resp.Body) != "from v0.1.0" {
		t.Fatalf("replay of the old record: %+v %v", resp, err)
	}
	k := newKey("op")
	p := mustAcquire(t, ctx, s, acquisition(k, "o", 0))
	if err := p.Save(ctx, []byte("1")); err != nil {
		t.Fatal(err)
	}
	p = mustAcquire(t, ctx, s, acquisition(k, "o", 0))
	if err := p.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("op")}); err != nil {
		t.Fatal(err)
	}
	if _, rec, err := s.Acquire(ctx, acquisition(k, "o", 0)); err != nil || rec == nil || string(rec.Body) != "op" {
		t.Fatalf("the operation's record: %+v %v", rec, err)
	}
}
