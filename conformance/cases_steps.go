package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// The Steps cases check the primitives of multi-step operations
// ([backend.Stepper], [backend.Phase]) directly, on a store that
// implements them; on any other store they are skipped, naming the
// interface.

// stepLease is the lease of the step cases that do not let it run out: far
// longer than any case.
const stepLease = time.Minute

// heldBound is how long a call that must not wait (an Acquire of a key
// leased to another owner, Inspect, Forget, Abandoned) may take.
const heldBound = 2 * time.Second

// stepRounds is how many rounds of [Callers] racing owners
// StepsTakeOverIsCAS fires, for each kind of key.
const stepRounds = 3

// need skips the case, before it builds a fixture, if an earlier case found
// that the fixture's store does not implement iface.
func (s *suite[Tx]) need(t *testing.T, iface string) {
	t.Helper()
	if s.lacks[iface] {
		t.Skipf("the store does not implement idempotency.%s (found by an earlier case): %s", iface, unchecked[iface])
	}
}

// unchecked says what is not checked on a store that lacks an interface.
var unchecked = map[string]string{
	"Stepper":      "multi-step operations are not checked",
	"KeyAdmin":     "Inspect and Forget are not checked",
	"KeyLister":    "List and Stats are not checked",
	"QuotaCounter": "quota counters are not checked",
}

// lacking skips the case: the fixture's store does not implement iface.
func (e *env[Tx]) lacking(iface string) {
	e.t.Helper()
	if e.lacks != nil {
		e.lacks[iface] = true
	}
	e.t.Skipf("the store (%T) does not implement idempotency.%s: %s", e.f.Store, iface, unchecked[iface])
}

// stepper returns the fixture's store as a Stepper, or skips the case.
func (e *env[Tx]) stepper() backend.Stepper[Tx] {
	e.t.Helper()
	st, ok := e.f.Store.(backend.Stepper[Tx])
	if !ok {
		e.lacking("Stepper")
	}
	return st
}

// stepAcq is an Acquisition of key for owner, with a fingerprint, a TTL of
// an hour, the long [stepLease] and no wait. Deadline bounds a store that
// waits for a lock on a first try (SQLite) even with no wait.
func stepAcq(key idempotency.Key, owner string) backend.Acquisition {
	return backend.Acquisition{
		Reservation: backend.Reservation{Key: key, Fingerprint: "fp-start", TTL: time.Hour, Deadline: time.Now().Add(5 * time.Second)},
		Owner:       owner,
		Lease:       stepLease,
	}
}

// waiting is a with a wait of d (and a deadline past it).
func waiting(a backend.Acquisition, d time.Duration) backend.Acquisition {
	a.Wait, a.Deadline = d, time.Now().Add(d+5*time.Second)
	return a
}

// acquireRetrying calls st.Acquire as the core would: again, for up to
// bound in all, while it reports a conflict to retry.
func (e *env[Tx]) acquireRetrying(st backend.Stepper[Tx], a backend.Acquisition, bound time.Duration) (p backend.Phase[Tx], rec *backend.Record, err error) {
	_, err = e.retryingConflicts(bound, func(time.Time) (err error) {
		p, rec, err = st.Acquire(e.ctx, a)
		return err
	})
	return p, rec, err
}

// phase fails the case unless a gives a Phase.
func (e *env[Tx]) phase(st backend.Stepper[Tx], a backend.Acquisition, what string) backend.Phase[Tx] {
	e.t.Helper()
	var (
		p   backend.Phase[Tx]
		rec *backend.Record
		err error
	)
	within(e.t, 20*time.Second, "Acquire: "+what, func() { p, rec, err = e.acquireRetrying(st, a, 10*time.Second) })
	if err != nil || p == nil {
		e.t.Fatalf("%s: Acquire by %q got %v, %+v, %v; want a Phase", what, a.Owner, p, rec, err)
	}
	return p
}

// heldFor fails the case unless a gets ErrInProgress within bound.
func (e *env[Tx]) heldFor(st backend.Stepper[Tx], a backend.Acquisition, bound time.Duration, what string) {
	e.t.Helper()
	var (
		p   backend.Phase[Tx]
		rec *backend.Record
		err error
	)
	start := time.Now()
	within(e.t, bound+10*time.Second, "Acquire: "+what, func() { p, rec, err = e.acquireRetrying(st, a, bound) })
	took := time.Since(start)
	if p != nil {
		_ = p.Rollback(e.ctx)
	}
	switch {
	case p != nil || rec != nil || !errors.Is(err, idempotency.ErrInProgress):
		e.t.Fatalf("%s: Acquire by %q got %v, %+v, %v; want an error wrapping ErrInProgress", what, a.Owner, p, rec, err)
	case took > bound:
		e.t.Fatalf("%s: Acquire by %q reported ErrInProgress after %v, want within %v", what, a.Owner, took, bound)
	}
}

// effect performs one effect tagged tag through tx.
func (e *env[Tx]) effect(tx Tx, tag string) {
	e.t.Helper()
	if err := e.f.Effect(e.ctx, tx, tag); err != nil {
		e.t.Fatalf("effect %q: %v", tag, err)
	}
}

// resumes acquires key as owner, requires the progress, fingerprint and
// tries the key was left with, and rolls the phase back.
func (e *env[Tx]) resumes(st backend.Stepper[Tx], key idempotency.Key, owner string, progress []byte, tries int, what string) {
	e.t.Helper()
	p := e.phase(st, stepAcq(key, owner), what)
	e.checkPhase(p, progress, "fp-start", tries, what)
	if err := p.Rollback(e.ctx); err != nil {
		e.t.Fatalf("%s: Rollback: %v", what, err)
	}
}

// checkPhase fails the case unless p has progress, fp and tries.
func (e *env[Tx]) checkPhase(p backend.Phase[Tx], progress []byte, fp string, tries int, what string) {
	e.t.Helper()
	got := p.Progress()
	if (got == nil) != (progress == nil) || !bytes.Equal(got, progress) {
		e.t.Fatalf("%s: Progress() is %s, want %s", what, showBytes(got), showBytes(progress))
	}
	if p.Fingerprint() != fp || p.Tries() != tries {
		e.t.Fatalf("%s: Fingerprint() %q, Tries() %d; want %q, %d", what, p.Fingerprint(), p.Tries(), fp, tries)
	}
}

// showBytes prints b briefly: nil, or its length and first bytes.
func showBytes(b []byte) string {
	if b == nil {
		return "nil"
	}
	if len(b) > 32 {
		return fmt.Sprintf("%d bytes %q...", len(b), b[:32])
	}
	return fmt.Sprintf("%q", b)
}

// binProgress is progress that is not text: NUL bytes, invalid UTF-8.
var binProgress = []byte{0, 0xff, 0xfe, '\n', 0x80, 's', 't', 'e', 'p', 0, '\\', '\'', 0xc3}

// stepsNewKey: Acquire of a new key gives a Phase with no progress and the
// Acquisition's fingerprint, holding the key as Reserve does. Save commits
// the phase's writes and leaves the key unfinished; Rollback instead frees
// it and discards the writes.
func (s *suite[Tx]) stepsNewKey(t *testing.T) {
	s.need(t, "Stepper")
	e := s.setup(t, Options{})
	st := e.stepper()
	key, tag := idempotency.Key{ID: uniq("new")}, uniq("saved")
	p := e.phase(st, stepAcq(key, "owner-a"), "a new key")
	e.checkPhase(p, nil, "fp-start", 0, "Acquire of a new key")
	// The key is held as Reserve holds it.
	var (
		txn backend.Txn[Tx]
		err error
	)
	r := reservation(key, 0)
	r.Deadline = time.Now().Add(heldBound)
	within(t, heldBound+10*time.Second, "Reserve of a key an open Phase holds", func() { txn, _, err = e.f.Store.Reserve(e.ctx, r) })
	if txn != nil {
		_ = txn.Rollback(e.ctx)
	}
	if txn != nil || !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("Reserve of a new key held by an open Phase: got %v, %v; want ErrInProgress", txn, err)
	}
	e.effect(p.Tx(), tag)
	if err := p.Save(e.ctx, []byte("step-1")); err != nil {
		t.Fatalf("Save: %v", err)
	}
	e.count(tag, 1, "Save commits the writes done through Tx")
	e.resumes(st, key, "owner-a", []byte("step-1"), 0, "the key after Save, its owner again")

	gone, tagGone := idempotency.Key{ID: uniq("gone")}, uniq("rolled-back")
	p = e.phase(st, stepAcq(gone, "owner-a"), "another new key")
	e.effect(p.Tx(), tagGone)
	if err := p.Rollback(e.ctx); err != nil {
		t.Fatalf("Rollback of a new key's phase: %v", err)
	}
	e.count(tagGone, 0, "Rollback discards the writes done through Tx")
	p = e.phase(st, stepAcq(gone, "owner-b"), "a new key whose first phase rolled back, another owner")
	e.checkPhase(p, nil, "fp-start", 0, "a new key whose first phase rolled back")
	if err := p.Rollback(e.ctx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	e.executes(e.guard(nil), gone, tagGone, "Do on a new key whose phases rolled back")
	e.count(tagGone, 1, "Do runs fn on a key whose phases rolled back")
}

// stepsReleaseCountsTries: Release commits the phase's writes and the
// progress, ends the lease now and counts a try; taking over and rolling
// back changes nothing.
func (s *suite[Tx]) stepsReleaseCountsTries(t *testing.T) {
	s.need(t, "Stepper")
	e := s.setup(t, Options{})
	st := e.stepper()
	key, tag := idempotency.Key{ID: uniq("tries")}, uniq("tries")
	p := e.phase(st, stepAcq(key, "owner-a"), "a new key")
	e.effect(p.Tx(), tag)
	if err := p.Save(e.ctx, []byte("p1")); err != nil {
		t.Fatalf("Save: %v", err)
	}
	p = e.phase(st, stepAcq(key, "owner-a"), "its owner again")
	e.checkPhase(p, []byte("p1"), "fp-start", 0, "its owner again")
	e.effect(p.Tx(), tag)
	if err := p.Release(e.ctx, []byte("p2")); err != nil {
		t.Fatalf("Release: %v", err)
	}
	e.count(tag, 2, "Release commits the writes done through Tx")
	// The lease ended now: another owner takes the key at once.
	b := e.phase(st, stepAcq(key, "owner-b"), "another owner right after a Release")
	e.checkPhase(b, []byte("p2"), "fp-start", 1, "another owner right after a Release")
	e.effect(b.Tx(), tag)
	if err := b.Rollback(e.ctx); err != nil {
		t.Fatalf("Rollback after taking over: %v", err)
	}
	e.count(tag, 2, "a Rollback after taking over discards its writes")
	// B's takeover and Rollback changed nothing: tries, progress, an ended
	// lease.
	c := e.phase(st, stepAcq(key, "owner-c"), "a third owner right after the second one rolled back")
	e.checkPhase(c, []byte("p2"), "fp-start", 1, "a third owner after a takeover rolled back")
	if err := c.Release(e.ctx, []byte("p3")); err != nil {
		t.Fatalf("Release: %v", err)
	}
	e.resumes(st, key, "owner-d", []byte("p3"), 2, "a fourth owner after two Releases")
}

// stepsComplete: Complete of an operation's last phase stores its answer
// byte-exact, with the creation of its first phase and an expiry of the
// store's clock plus the last Acquisition's TTL, and clears its progress.
func (s *suite[Tx]) stepsComplete(t *testing.T) {
	s.need(t, "Stepper")
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	st := e.stepper()
	t0 := clk.Now()
	key, tag := idempotency.Key{ID: uniq("done")}, uniq("done")
	a := stepAcq(key, "owner-a")
	p := e.phase(st, a, "a new key")
	e.effect(p.Tx(), tag)
	if err := p.Save(e.ctx, []byte("p1")); err != nil {
		t.Fatalf("Save: %v", err)
	}
	clk.Add(time.Minute)
	p = e.phase(st, a, "its owner, a minute later")
	e.effect(p.Tx(), tag)
	if err := p.Release(e.ctx, []byte("p2")); err != nil {
		t.Fatalf("Release: %v", err)
	}
	clk.Add(time.Minute)
	last := stepAcq(key, "owner-b")
	last.TTL = 2 * time.Hour
	p = e.phase(st, last, "another owner, two minutes later")
	e.effect(p.Tx(), tag)
	resp := idempotency.Response{
		Status: http.StatusAccepted,
		Header: http.Header{"Content-Type": {"application/octet-stream"}, "X-Step": {"\xff\x00bin", "second"}},
		Body:   append([]byte("done:"), binProgress...),
	}
	if err := p.Complete(e.ctx, resp); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	e.count(tag, 3, "the operation's three phases")
	end := t0.Add(2*time.Minute + 2*time.Hour)
	check := func(rec *backend.Record, what string) {
		t.Helper()
		switch {
		case rec == nil:
			t.Fatalf("%s: no record", what)
		case rec.Key != key || rec.Fingerprint != "fp-start":
			t.Fatalf("%s: key %v, fingerprint %q; want %v, %q (the operation's start)", what, rec.Key, rec.Fingerprint, key, "fp-start")
		case !sameResponse(rec.Response(), resp) || len(rec.Body) != len(resp.Body):
			t.Fatalf("%s: %d %v %q; want %d %v %q byte-exact", what, rec.Status, rec.Header, rec.Body, resp.Status, resp.Header, resp.Body)
		case !rec.CreatedAt.Equal(t0):
			t.Fatalf("%s: CreatedAt %v, want %v: the operation's first Acquire, not its last phase", what, rec.CreatedAt, t0)
		case !rec.ExpiresAt.Equal(end):
			t.Fatalf("%s: ExpiresAt %v, want %v: the store's clock at Complete plus the last Acquisition's TTL", what, rec.ExpiresAt, end)
		}
	}
	q, rec, err := st.Acquire(e.ctx, stepAcq(key, "owner-c"))
	if q != nil || err != nil {
		if q != nil {
			_ = q.Rollback(e.ctx)
		}
		t.Fatalf("Acquire of a completed key: got %v, %v; want its record", q, err)
	}
	check(rec, "Acquire of the completed key")
	txn, rec, err := e.f.Store.Reserve(e.ctx, reservation(key, 0))
	if txn != nil || err != nil {
		if txn != nil {
			_ = txn.Rollback(e.ctx)
		}
		t.Fatalf("Reserve of a completed key: got %v, %v; want its record", txn, err)
	}
	check(rec, "Reserve of the completed key")
	r, err := e.guard(nil).Do(e.ctx, key, "fp-start", mustNotRun[Tx])
	if err != nil || !r.Replayed || !sameResponse(r, resp) {
		t.Fatalf("Do of the completed key: got %+v, %v; want its answer replayed", r, err)
	}
	clk.Set(end.Add(-time.Millisecond))
	if q, rec, err = st.Acquire(e.ctx, stepAcq(key, "owner-c")); q != nil || err != nil {
		if q != nil {
			_ = q.Rollback(e.ctx)
		}
		t.Fatalf("Acquire 1ms before the completed key expires: got %v, %v; want its record", q, err)
	}
	check(rec, "Acquire 1ms before the completed key expires")
	// Once expired, the key is new: no progress, no tries were kept.
	clk.Set(end)
	fresh := stepAcq(key, "owner-c")
	fresh.Fingerprint = "fp-again"
	p = e.phase(st, fresh, "the completed key once expired")
	e.checkPhase(p, nil, "fp-again", 0, "the completed key once expired (progress and tries cleared)")
	if err := p.Rollback(e.ctx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
}
