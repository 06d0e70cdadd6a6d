package conformance

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// The Steps cases check the primitives of multi-step operations
// ([idempotency.Stepper], [idempotency.Phase]) directly, on a store that
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
func (e *env[Tx]) stepper() idempotency.Stepper[Tx] {
	e.t.Helper()
	st, ok := e.f.Store.(idempotency.Stepper[Tx])
	if !ok {
		e.lacking("Stepper")
	}
	return st
}

// stepAcq is an Acquisition of key for owner, with a fingerprint, a TTL of
// an hour, the long [stepLease] and no wait. Deadline bounds a store that
// waits for a lock on a first try (SQLite) even with no wait.
func stepAcq(key idempotency.Key, owner string) idempotency.Acquisition {
	return idempotency.Acquisition{
		Reservation: idempotency.Reservation{Key: key, Fingerprint: "fp-start", TTL: time.Hour, Deadline: time.Now().Add(5 * time.Second)},
		Owner:       owner,
		Lease:       stepLease,
	}
}

// waiting is a with a wait of d (and a deadline past it).
func waiting(a idempotency.Acquisition, d time.Duration) idempotency.Acquisition {
	a.Wait, a.Deadline = d, time.Now().Add(d+5*time.Second)
	return a
}

// acquireRetrying calls st.Acquire as the core would: again, for up to
// bound in all, while it reports a conflict to retry.
func (e *env[Tx]) acquireRetrying(st idempotency.Stepper[Tx], a idempotency.Acquisition, bound time.Duration) (idempotency.Phase[Tx], *idempotency.Record, error) {
	deadline := time.Now().Add(bound)
	for {
		p, rec, err := st.Acquire(e.ctx, a)
		if !errors.Is(err, idempotency.ErrConflict) || !time.Now().Before(deadline) {
			return p, rec, err
		}
		select {
		case <-e.ctx.Done():
			return p, rec, err
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// phase fails the case unless a gives a Phase.
func (e *env[Tx]) phase(st idempotency.Stepper[Tx], a idempotency.Acquisition, what string) idempotency.Phase[Tx] {
	e.t.Helper()
	var (
		p   idempotency.Phase[Tx]
		rec *idempotency.Record
		err error
	)
	within(e.t, 20*time.Second, "Acquire: "+what, func() { p, rec, err = e.acquireRetrying(st, a, 10*time.Second) })
	if err != nil || p == nil {
		e.t.Fatalf("%s: Acquire by %q got %v, %+v, %v; want a Phase", what, a.Owner, p, rec, err)
	}
	return p
}

// heldFor fails the case unless a gets ErrInProgress within bound.
func (e *env[Tx]) heldFor(st idempotency.Stepper[Tx], a idempotency.Acquisition, bound time.Duration, what string) {
	e.t.Helper()
	var (
		p   idempotency.Phase[Tx]
		rec *idempotency.Record
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
func (e *env[Tx]) resumes(st idempotency.Stepper[Tx], key idempotency.Key, owner string, progress []byte, tries int, what string) {
	e.t.Helper()
	p := e.phase(st, stepAcq(key, owner), what)
	e.checkPhase(p, progress, "fp-start", tries, what)
	if err := p.Rollback(e.ctx); err != nil {
		e.t.Fatalf("%s: Rollback: %v", what, err)
	}
}

// checkPhase fails the case unless p has progress, fp and tries.
func (e *env[Tx]) checkPhase(p idempotency.Phase[Tx], progress []byte, fp string, tries int, what string) {
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
		txn idempotency.Txn[Tx]
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

// stepsResumeOwnLease: the owner of a live lease acquires its key again and
// gets the progress last saved, byte-exact (binary, and MaxProgressLen
// bytes), and the fingerprint the operation started with.
func (s *suite[Tx]) stepsResumeOwnLease(t *testing.T) {
	s.need(t, "Stepper")
	e := s.setup(t, Options{})
	st := e.stepper()
	key, tag := idempotency.Key{ID: uniq("own")}, uniq("own")
	p := e.phase(st, stepAcq(key, "owner-a"), "a new key")
	e.effect(p.Tx(), tag)
	if err := p.Save(e.ctx, binProgress); err != nil {
		t.Fatalf("Save: %v", err)
	}
	again := stepAcq(key, "owner-a")
	again.Fingerprint = "fp-other" // the core compares, not the store
	p = e.phase(st, again, "its owner, while its lease lives")
	e.checkPhase(p, binProgress, "fp-start", 0, "its owner, after saving binary progress")
	big := make([]byte, idempotency.MaxProgressLen)
	_, _ = rand.Read(big)
	e.effect(p.Tx(), tag)
	if err := p.Save(e.ctx, big); err != nil {
		t.Fatalf("Save of MaxProgressLen bytes: %v", err)
	}
	p = e.phase(st, again, "its owner, after a second Save")
	e.checkPhase(p, big, "fp-start", 0, "its owner, after saving MaxProgressLen bytes")
	e.effect(p.Tx(), uniq("discarded"))
	if err := p.Rollback(e.ctx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	e.count(tag, 2, "two saved phases")
	e.resumes(st, key, "owner-a", big, 0, "its owner, after a Rollback")
}

// stepsOtherOwnerLiveLease: another owner is refused at once while the
// lease lives, whatever its wait, and changes nothing; while the owner's
// phase is open, another owner waits for it.
func (s *suite[Tx]) stepsOtherOwnerLiveLease(t *testing.T) {
	s.need(t, "Stepper")
	e := s.setup(t, Options{})
	st := e.stepper()
	key, tag := idempotency.Key{ID: uniq("leased")}, uniq("leased")
	p := e.phase(st, stepAcq(key, "owner-a"), "a new key")
	e.effect(p.Tx(), tag)
	if err := p.Save(e.ctx, []byte("p1")); err != nil {
		t.Fatalf("Save: %v", err)
	}
	e.heldFor(st, waiting(stepAcq(key, "owner-b"), 10*time.Second), heldBound, "another owner with a 10s wait, while the lease lives")
	e.heldFor(st, stepAcq(key, "owner-b"), heldBound, "another owner with no wait, while the lease lives")

	// The owner's phase is open: another owner either waits for its
	// transaction, then finds the lease live, or reports the live lease at
	// once (both hold: the contract allows either). It never gets a Phase.
	p = e.phase(st, stepAcq(key, "owner-a"), "its owner again")
	e.checkPhase(p, []byte("p1"), "fp-start", 0, "its owner, after another owner was refused")
	type acquired struct {
		p   idempotency.Phase[Tx]
		err error
	}
	out := make(chan acquired, 1)
	go func() {
		p, _, err := e.acquireRetrying(st, waiting(stepAcq(key, "owner-b"), 10*time.Second), 10*time.Second)
		out <- acquired{p, err}
	}()
	time.Sleep(200 * time.Millisecond)
	var b acquired
	early := false
	select {
	case b = <-out:
		early = true
		if b.p != nil {
			_ = b.p.Rollback(e.ctx)
		}
		if b.p != nil || !errors.Is(b.err, idempotency.ErrInProgress) {
			t.Fatalf("another owner with a 10s wait, while the owner's phase is open: got %v, %v; want ErrInProgress (the lease is live) or a wait", b.p, b.err)
		}
	default:
	}
	e.effect(p.Tx(), tag)
	if err := p.Save(e.ctx, []byte("p2")); err != nil {
		t.Fatalf("Save: %v", err)
	}
	if !early {
		within(t, heldBound, "another owner's Acquire once the phase it waited for saved", func() { b = <-out })
	}
	if b.p != nil {
		_ = b.p.Rollback(e.ctx)
	}
	if b.p != nil || !errors.Is(b.err, idempotency.ErrInProgress) {
		t.Fatalf("another owner that waited for a phase which saved a live lease: got %v, %v; want ErrInProgress", b.p, b.err)
	}
	e.count(tag, 2, "the owner's two phases")
	e.resumes(st, key, "owner-a", []byte("p2"), 0, "its owner, after another owner was refused")
}

// stepsLeaseClock: a lease ends by the store's clock, not by the time that
// passed: another owner takes the key exactly at its end, and the first
// owner, now stale, is refused.
func (s *suite[Tx]) stepsLeaseClock(t *testing.T) {
	s.need(t, "Stepper")
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	st := e.stepper()
	key, tagA, tagB := idempotency.Key{ID: uniq("lease")}, uniq("a"), uniq("b")
	p := e.phase(st, stepAcq(key, "owner-a"), "a new key")
	e.effect(p.Tx(), tagA)
	if err := p.Save(e.ctx, []byte("a-1")); err != nil {
		t.Fatalf("Save: %v", err)
	}
	clk.Add(stepLease - time.Millisecond)
	e.heldFor(st, stepAcq(key, "owner-b"), heldBound, "another owner 1ms before the lease ends by the store's clock")
	clk.Add(time.Millisecond)
	b := e.phase(st, stepAcq(key, "owner-b"), "another owner when the lease ended by the store's clock")
	e.checkPhase(b, []byte("a-1"), "fp-start", 0, "another owner taking over an ended lease")
	e.effect(b.Tx(), tagB)
	if err := b.Save(e.ctx, []byte("b-1")); err != nil {
		t.Fatalf("B's Save: %v", err)
	}
	e.heldFor(st, stepAcq(key, "owner-a"), heldBound, "the first owner, whose lease another owner took over")
	e.count(tagA, 1, "the first owner's phase")
	e.count(tagB, 1, "the new owner's phase")
	e.resumes(st, key, "owner-b", []byte("b-1"), 0, "the new owner, after the stale one was refused")

	// A 1ms lease does not end while the store's clock stands still.
	still := idempotency.Key{ID: uniq("still")}
	a := stepAcq(still, "owner-a")
	a.Lease = time.Millisecond
	p = e.phase(st, a, "a new key, 1ms lease")
	if err := p.Save(e.ctx, []byte("a-1")); err != nil {
		t.Fatalf("Save: %v", err)
	}
	time.Sleep(50 * time.Millisecond)
	e.heldFor(st, stepAcq(still, "owner-b"), heldBound, "another owner, 50ms after a 1ms lease began on a store clock that stands still")
	clk.Add(time.Millisecond)
	e.resumes(st, still, "owner-b", []byte("a-1"), 0, "another owner once the store's clock passed the 1ms lease")
}

// stepsTakeOverIsCAS: Callers owners race, over several store instances,
// for a key whose lease was released, then for a new key; exactly one
// obtains a Phase, and none while another's is open.
func (s *suite[Tx]) stepsTakeOverIsCAS(t *testing.T) {
	s.need(t, "Stepper")
	e := s.setup(t, Options{})
	e.stepper()
	var sts []idempotency.Stepper[Tx]
	for _, store := range e.instances(storeInstances) {
		st, ok := store.(idempotency.Stepper[Tx])
		if !ok {
			t.Fatalf("Fixture.Reopen gave a %T, which does not implement idempotency.Stepper as the fixture's store does", store)
		}
		sts = append(sts, st)
	}
	for round := range stepRounds {
		for _, abandoned := range []bool{true, false} {
			key, tag := idempotency.Key{ID: uniq("race")}, uniq("race")
			what := fmt.Sprintf("round %d: %d owners on %d store instances racing for a new key", round, Callers, len(sts))
			wait := 5 * time.Second // they wait for the winner's phase, then find its lease
			if abandoned {
				p := e.phase(sts[0], stepAcq(key, "owner-first"), "a new key")
				if err := p.Release(e.ctx, []byte("released")); err != nil {
					t.Fatalf("Release: %v", err)
				}
				what = fmt.Sprintf("round %d: %d owners on %d store instances racing for a key whose lease was released", round, Callers, len(sts))
				wait = 0
			}
			var active, most, phases atomic.Int64
			errs := make([]error, Callers)
			gate := make(chan struct{})
			var wg sync.WaitGroup
			for i := range Callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-gate
					a := waiting(stepAcq(key, fmt.Sprint("racer-", i)), wait)
					p, rec, err := e.acquireRetrying(sts[i%len(sts)], a, 10*time.Second)
					switch {
					case rec != nil:
						err = fmt.Errorf("got a record %+v", rec)
					case p != nil:
						phases.Add(1)
						n := active.Add(1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						time.Sleep(20 * time.Millisecond) // the others meet the open phase
						if err = e.f.Effect(e.ctx, p.Tx(), tag); err != nil {
							_ = p.Rollback(e.ctx)
						} else {
							err = p.Save(e.ctx, []byte(fmt.Sprint("racer-", i)))
						}
						active.Add(-1)
						if err == nil {
							err = errWon
						}
					}
					errs[i] = err
				}()
			}
			within(t, 30*time.Second, what, func() { close(gate); wg.Wait() })
			if n, m := phases.Load(), most.Load(); n != 1 || m != 1 {
				t.Fatalf("%s: %d obtained a Phase (at most %d at once), want exactly 1", what, n, m)
			}
			winner := -1
			for i, err := range errs {
				switch {
				case errors.Is(err, errWon):
					winner = i
				case !errors.Is(err, idempotency.ErrInProgress):
					t.Fatalf("%s: owner %d got %v, want a Phase or ErrInProgress", what, i, err)
				}
			}
			if winner < 0 {
				t.Fatalf("%s: the owner that obtained the Phase failed to save: %v", what, errs)
			}
			e.count(tag, 1, what+": the winner's phase")
			e.heldFor(sts[0], stepAcq(key, "owner-late"), heldBound, what+": a late owner, while the winner's lease lives")
			e.resumes(sts[0], key, fmt.Sprint("racer-", winner), []byte(fmt.Sprint("racer-", winner)), btoi(abandoned), what+": the winner")
		}
	}
}

// errWon marks the racer that obtained a Phase and saved it.
var errWon = errors.New("conformance: obtained the Phase")

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
	check := func(rec *idempotency.Record, what string) {
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

// stepsReserveUnfinished: Reserve and Do report an unfinished key held,
// whether its lease lives or was released, and change nothing.
func (s *suite[Tx]) stepsReserveUnfinished(t *testing.T) {
	s.need(t, "Stepper")
	e := s.setup(t, Options{})
	st := e.stepper()
	g := e.guard(&idempotency.Config{WaitTimeout: 300 * time.Millisecond})
	for _, released := range []bool{false, true} {
		key, tag := idempotency.Key{ID: uniq("unfinished")}, uniq("unfinished")
		what := "an unfinished key whose lease lives"
		p := e.phase(st, stepAcq(key, "owner-a"), "a new key")
		e.effect(p.Tx(), tag)
		var err error
		if released {
			what = "an unfinished key whose lease was released"
			err = p.Release(e.ctx, []byte("p1"))
		} else {
			err = p.Save(e.ctx, []byte("p1"))
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for _, wait := range []time.Duration{0, 300 * time.Millisecond} {
			var (
				txn idempotency.Txn[Tx]
				rec *idempotency.Record
			)
			r := reservation(key, wait)
			r.Deadline = time.Now().Add(wait + heldBound)
			within(t, wait+10*time.Second, "Reserve of "+what, func() { txn, rec, err = e.f.Store.Reserve(e.ctx, r) })
			if txn != nil {
				_ = txn.Rollback(e.ctx)
			}
			if txn != nil || rec != nil || !errors.Is(err, idempotency.ErrInProgress) {
				t.Fatalf("Reserve (wait %v) of %s: got %v, %+v, %v; want ErrInProgress", wait, what, txn, rec, err)
			}
		}
		var resp idempotency.Response
		within(t, 10*time.Second, "Do of "+what, func() { resp, err = g.Do(e.ctx, key, "fp-start", mustNotRun[Tx]) })
		if !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("Do of %s: got %+v, %v; want ErrInProgress and fn not run", what, resp, err)
		}
		e.count(tag, 1, what)
		owner := "owner-a"
		if released {
			owner = "owner-b"
		}
		e.resumes(st, key, owner, []byte("p1"), btoi(released), what+", after Reserve and Do")
	}
}

// stepsPurgeSkipsUnfinished: years later, Purge deletes the expired
// records and no unfinished key, which is still held and resumable.
func (s *suite[Tx]) stepsPurgeSkipsUnfinished(t *testing.T) {
	s.need(t, "Stepper")
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	st := e.stepper()
	g := e.guard(&idempotency.Config{TTL: time.Hour})
	done := make([]idempotency.Key, 3)
	for i := range done {
		done[i] = idempotency.Key{ID: uniq("done")}
		e.executes(g, done[i], "done", "a new key")
	}
	live, released := idempotency.Key{ID: uniq("live")}, idempotency.Key{ID: uniq("released")}
	p := e.phase(st, stepAcq(live, "owner-a"), "a new key")
	if err := p.Save(e.ctx, []byte("live")); err != nil {
		t.Fatalf("Save: %v", err)
	}
	p = e.phase(st, stepAcq(released, "owner-a"), "a new key")
	if err := p.Release(e.ctx, []byte("released")); err != nil {
		t.Fatalf("Release: %v", err)
	}
	clk.Add(10 * 365 * 24 * time.Hour)
	want := len(done)
	if s.h.Features.SelfExpiring {
		want = 0
	}
	for i, w := range []int{want, 0} {
		var (
			n   int
			err error
		)
		within(t, 20*time.Second, "Purge", func() { n, err = e.f.Store.Purge(e.ctx, 100) })
		if err != nil || n != w {
			t.Fatalf("Purge %d, ten years on, with %d expired records and 2 unfinished keys: got %d, %v; want %d", i+1, len(done), n, err, w)
		}
	}
	ad, _ := e.f.Store.(idempotency.KeyAdmin)
	for _, k := range []idempotency.Key{live, released} {
		txn, rec, err := e.f.Store.Reserve(e.ctx, reservation(k, 0))
		if txn != nil {
			_ = txn.Rollback(e.ctx)
		}
		if txn != nil || rec != nil || !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("Reserve of an unfinished key ten years on: got %v, %+v, %v; want ErrInProgress", txn, rec, err)
		}
		if ad != nil {
			info, err := ad.Inspect(e.ctx, k, false)
			if err != nil || !isMaxExpiry(info.ExpiresAt) {
				t.Fatalf("Inspect of an unfinished key: got %+v, %v; want ExpiresAt MaxExpiry (%v)", info, err, idempotency.MaxExpiry())
			}
		}
	}
	e.resumes(st, live, "owner-b", []byte("live"), 0, "a saved key ten years on")
	e.resumes(st, released, "owner-b", []byte("released"), 1, "a released key ten years on")
	for _, k := range done {
		e.executes(g, k, "done", "a purged key")
	}
	e.count("done", 2*len(done), "purged keys count as new")
}

// isMaxExpiry reports whether t is MaxExpiry, kept to the millisecond
// (rounding down) or better.
func isMaxExpiry(t time.Time) bool {
	m := idempotency.MaxExpiry()
	return !t.After(m) && t.After(m.Add(-time.Millisecond))
}

// stepsAbandoned: Abandoned lists the unfinished keys whose lease ended at
// least Grace ago with fewer tries than MaxTries, longest ended first, up
// to Limit, with their fields exact; it takes no lease and waits for no
// open phase.
func (s *suite[Tx]) stepsAbandoned(t *testing.T) {
	s.need(t, "Stepper")
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	st := e.stepper()
	t0 := clk.Now()
	type made struct {
		key   idempotency.Key
		fp    string
		prog  []byte
		tries int
		ended time.Time
	}
	released := func(id string, tries int) made {
		m := made{key: idempotency.Key{Scope: "abandoned/" + id, ID: uniq(id)}, fp: "fp-" + id, prog: append([]byte(id+":"), binProgress...), tries: tries}
		for i := range tries {
			a := stepAcq(m.key, fmt.Sprint("owner-", i))
			a.Fingerprint = m.fp
			p := e.phase(st, a, id)
			if err := p.Release(e.ctx, m.prog); err != nil {
				t.Fatalf("%s: Release: %v", id, err)
			}
		}
		m.ended = clk.Now()
		return m
	}
	k1 := released("k1", 1)
	clk.Add(time.Minute)
	k2 := released("k2", 1)
	clk.Add(time.Minute)
	k3 := released("k3", 2)
	k4 := made{key: idempotency.Key{ID: uniq("k4")}, fp: "fp-start", prog: []byte("k4"), ended: clk.Now().Add(10 * time.Minute)}
	a4 := stepAcq(k4.key, "owner-a")
	a4.Lease = 10 * time.Minute
	p := e.phase(st, a4, "k4")
	if err := p.Save(e.ctx, k4.prog); err != nil {
		t.Fatalf("k4: Save: %v", err)
	}
	e.executes(e.guard(nil), idempotency.Key{ID: uniq("k5")}, "k5", "a completed key")
	clk.Add(time.Minute)
	k6 := released("k6", 1)
	clk.Set(t0.Add(5 * time.Minute))

	list := func(q idempotency.AbandonedQuery, want []made, what string) {
		t.Helper()
		var (
			got []idempotency.AbandonedKey
			err error
		)
		within(t, heldBound+10*time.Second, "Abandoned", func() { got, err = st.Abandoned(e.ctx, q) })
		if err != nil {
			t.Fatalf("Abandoned(%+v), %s: %v", q, what, err)
		}
		ids := func() string {
			var b strings.Builder
			for _, k := range got {
				fmt.Fprintf(&b, "%v ", k.Key)
			}
			return b.String()
		}
		if len(got) != len(want) {
			t.Fatalf("Abandoned(%+v), %s: got %d keys (%s), want %d", q, what, len(got), ids(), len(want))
		}
		for i, w := range want {
			g := got[i]
			if g.Key != w.key || g.Fingerprint != w.fp || !bytes.Equal(g.Progress, w.prog) || g.Tries != w.tries || !g.LeaseEnded.Equal(w.ended) {
				t.Fatalf("Abandoned(%+v), %s: key %d is {%+q %q %s tries %d ended %v}, want {%+q %q %s tries %d ended %v} (longest ended first)",
					q, what, i, g.Key, g.Fingerprint, showBytes(g.Progress), g.Tries, g.LeaseEnded, w.key, w.fp, showBytes(w.prog), w.tries, w.ended)
			}
		}
	}
	all := idempotency.AbandonedQuery{MaxTries: 10, Limit: 1000}
	list(all, []made{k1, k2, k3, k6}, "at t0+5m")
	list(idempotency.AbandonedQuery{Grace: 3 * time.Minute, MaxTries: 10, Limit: 1000}, []made{k1, k2, k3}, "Grace 3m (k3 ended exactly 3m ago)")
	list(idempotency.AbandonedQuery{Grace: 3*time.Minute + time.Millisecond, MaxTries: 10, Limit: 1000}, []made{k1, k2}, "Grace 3m1ms")
	list(idempotency.AbandonedQuery{MaxTries: 2, Limit: 1000}, []made{k1, k2, k6}, "MaxTries 2 (k3 has 2)")
	list(idempotency.AbandonedQuery{MaxTries: 1, Limit: 1000}, nil, "MaxTries 1")
	list(idempotency.AbandonedQuery{MaxTries: 10, Limit: 2}, []made{k1, k2}, "Limit 2")
	list(idempotency.AbandonedQuery{MaxTries: 10, Limit: 1}, []made{k1}, "Limit 1")
	clk.Set(k4.ended)
	list(all, []made{k1, k2, k3, k6, k4}, "when k4's lease ran out, unreleased")

	// It took no lease: another owner takes k1 at once. While that phase is
	// open, Abandoned does not wait for it.
	p = e.phase(st, stepAcq(k1.key, "owner-z"), "k1 right after Abandoned listed it")
	var err error
	within(t, heldBound, "Abandoned while a phase is open", func() { _, err = st.Abandoned(e.ctx, all) })
	if err != nil {
		t.Fatalf("Abandoned while a phase is open: %v", err)
	}
	if err := p.Rollback(e.ctx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	list(all, []made{k1, k2, k3, k6, k4}, "after a phase of k1 rolled back")
}

// stepsOneConnection: phases of many keys at once on a pool of two
// connections; no method asks for a second connection while it holds
// one, so none deadlocks.
func (s *suite[Tx]) stepsOneConnection(t *testing.T) {
	s.need(t, "Stepper")
	e := s.setup(t, Options{MaxConns: 2})
	st := e.stepper()
	ad, _ := e.f.Store.(idempotency.KeyAdmin)
	shared, sharedTag := idempotency.Key{ID: uniq("shared")}, uniq("shared")
	keys := make([]idempotency.Key, Callers)
	errs := make([]error, Callers)
	var won atomic.Int64
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range Callers {
		keys[i] = idempotency.Key{ID: uniq("pool")}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			errs[i] = e.poolPhases(st, ad, keys[i], fmt.Sprint("pool-", i), fmt.Sprint("owner-", i))
			if errs[i] != nil || i%2 == 1 {
				return
			}
			// Half the callers also race for one shared key. A phase whose
			// effect or commit met a conflict (SERIALIZABLE) applied nothing
			// and is tried again, as the core tries it.
			var err error
			for range 10 {
				var p idempotency.Phase[Tx]
				p, _, err = e.acquireRetrying(st, waiting(stepAcq(shared, fmt.Sprint("owner-", i)), 10*time.Second), 10*time.Second)
				switch {
				case p != nil:
					if err = e.f.Effect(e.ctx, p.Tx(), sharedTag); err != nil {
						_ = p.Rollback(e.ctx)
						if cc, ok := e.f.Store.(idempotency.ConflictClassifier); ok && cc.IsConflict(err) {
							err = fmt.Errorf("%w: %w", idempotency.ErrConflict, err)
						}
					} else if err = p.Save(e.ctx, []byte("shared")); err == nil {
						won.Add(1)
					}
				case errors.Is(err, idempotency.ErrInProgress):
					err = nil
				}
				if !errors.Is(err, idempotency.ErrConflict) {
					break
				}
			}
			errs[i] = err
		}()
	}
	within(t, 40*time.Second, fmt.Sprintf("%d callers running phases on a pool of 2 connections", Callers), func() { close(gate); wg.Wait() })
	for i, err := range errs {
		if err != nil {
			t.Fatalf("caller %d on a pool of 2 connections: %v", i, err)
		}
	}
	if n := won.Load(); n != 1 {
		t.Fatalf("%d callers committed a Phase of the shared key, want 1", n)
	}
	e.count(sharedTag, 1, "the shared key's one phase")
	for i := range keys {
		e.count(fmt.Sprint("pool-", i), 3, "three phases of one key on a pool of 2 connections")
	}
	want := created("pool-0", 3)
	if r, err := e.guard(nil).Do(e.ctx, keys[0], "fp-start", mustNotRun[Tx]); err != nil || !r.Replayed || !sameResponse(r, want) {
		t.Fatalf("a key completed on a pool of 2 connections: got %+v, %v; want %q replayed", r, err, want.Body)
	}
}

// poolPhases runs three phases of key (Save, Release, Complete), each with
// one effect tagged tag, with an Abandoned and an Inspect between them; it
// reports instead of failing (it runs on a goroutine of its own).
func (e *env[Tx]) poolPhases(st idempotency.Stepper[Tx], ad idempotency.KeyAdmin, key idempotency.Key, tag, owner string) error {
	for i := range 3 {
		// A commit that meets a conflict (a serialization failure under
		// SERIALIZABLE) applied nothing: the phase is tried again, as the
		// core tries it.
		var err error
		for range 10 {
			if err = e.poolPhase(st, ad, key, tag, owner, i); !errors.Is(err, idempotency.ErrConflict) {
				break
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// poolPhase is phase i of poolPhases.
func (e *env[Tx]) poolPhase(st idempotency.Stepper[Tx], ad idempotency.KeyAdmin, key idempotency.Key, tag, owner string, i int) error {
	a := waiting(stepAcq(key, owner), 10*time.Second)
	p, rec, err := e.acquireRetrying(st, a, 10*time.Second)
	if err != nil || p == nil {
		return fmt.Errorf("phase %d: Acquire got %v, %+v, %v; want a Phase", i, p, rec, err)
	}
	if err := e.f.Effect(e.ctx, p.Tx(), tag); err != nil {
		_ = p.Rollback(e.ctx)
		if cc, ok := e.f.Store.(idempotency.ConflictClassifier); ok && cc.IsConflict(err) {
			err = fmt.Errorf("%w: %w", idempotency.ErrConflict, err)
		}
		return fmt.Errorf("phase %d: effect: %w", i, err)
	}
	switch i {
	case 0:
		err = p.Save(e.ctx, []byte("p0"))
	case 1:
		err = p.Release(e.ctx, []byte("p1"))
	default:
		err = p.Complete(e.ctx, created(tag, 3))
	}
	if err != nil {
		return fmt.Errorf("phase %d: %w", i, err)
	}
	if _, err := st.Abandoned(e.ctx, idempotency.AbandonedQuery{MaxTries: 10, Limit: 5}); err != nil {
		return fmt.Errorf("Abandoned after phase %d: %w", i, err)
	}
	if ad != nil {
		if _, err := ad.Inspect(e.ctx, key, true); err != nil {
			return fmt.Errorf("Inspect after phase %d: %w", i, err)
		}
	}
	return nil
}

// stepsInvalidInput: an owner or a lease out of the contract's bounds, a
// nil or oversized progress and an Abandoned limit out of 1..1000 are
// refused with ErrInvalidConfig (the suite requires that error: the
// contract states the bounds, not the error) before anything is written.
func (s *suite[Tx]) stepsInvalidInput(t *testing.T) {
	s.need(t, "Stepper")
	e := s.setup(t, Options{})
	st := e.stepper()
	key, tag := idempotency.Key{ID: uniq("bad")}, uniq("bad")
	refused := func(a idempotency.Acquisition, what string) {
		t.Helper()
		var (
			p   idempotency.Phase[Tx]
			rec *idempotency.Record
			err error
		)
		within(t, 10*time.Second, "Acquire with "+what, func() { p, rec, err = st.Acquire(e.ctx, a) })
		if p != nil {
			_ = p.Rollback(e.ctx)
		}
		if p != nil || rec != nil || !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Fatalf("Acquire with %s: got %v, %+v, %v; want an error wrapping ErrInvalidConfig", what, p, rec, err)
		}
	}
	badOwners := map[string]string{
		"an empty owner": "", "a 65-byte owner": strings.Repeat("o", 65), "an owner with a tab": "tab\towner",
		"an owner with a NUL": "nul\x00", "a non-ASCII owner": "öwner", "an owner with DEL": "del\x7f",
	}
	for what, owner := range badOwners {
		refused(stepAcq(key, owner), what)
	}
	for _, lease := range []time.Duration{0, -time.Second, time.Millisecond - time.Nanosecond} {
		a := stepAcq(key, "owner-a")
		a.Lease = lease
		refused(a, fmt.Sprintf("a lease of %v", lease))
	}
	// The longest owner and the shortest lease are accepted, on a key the
	// refused calls left new.
	long := stepAcq(key, strings.Repeat("o", 64))
	long.Lease = time.Millisecond
	p := e.phase(st, long, "a 64-byte owner and a 1ms lease")
	e.checkPhase(p, nil, "fp-start", 0, "a new key after refused Acquires")
	if err := p.Rollback(e.ctx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}

	for _, c := range []struct {
		what     string
		progress []byte
	}{{"nil progress", nil}, {"MaxProgressLen+1 bytes of progress", make([]byte, idempotency.MaxProgressLen+1)}} {
		p := e.phase(st, stepAcq(key, "owner-a"), "a new key")
		e.checkPhase(p, nil, "fp-start", 0, "a new key after a refused Save")
		e.effect(p.Tx(), tag)
		var err error
		within(t, 10*time.Second, "Save with "+c.what, func() { err = p.Save(e.ctx, c.progress) })
		if !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Fatalf("Save with %s: got %v, want an error wrapping ErrInvalidConfig", c.what, err)
		}
		e.count(tag, 0, "a refused Save writes nothing")
	}
	p = e.phase(st, stepAcq(key, "owner-a"), "a new key")
	e.checkPhase(p, nil, "fp-start", 0, "a new key after refused Saves")
	if err := p.Save(e.ctx, []byte("p1")); err != nil {
		t.Fatalf("Save: %v", err)
	}
	for _, c := range []struct {
		what     string
		progress []byte
	}{{"nil progress", nil}, {"MaxProgressLen+1 bytes of progress", make([]byte, idempotency.MaxProgressLen+1)}} {
		p := e.phase(st, stepAcq(key, "owner-a"), "its owner")
		e.effect(p.Tx(), tag)
		var err error
		within(t, 10*time.Second, "Release with "+c.what, func() { err = p.Release(e.ctx, c.progress) })
		if !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Fatalf("Release with %s: got %v, want an error wrapping ErrInvalidConfig", c.what, err)
		}
		e.count(tag, 0, "a refused Release writes nothing")
		e.resumes(st, key, "owner-a", []byte("p1"), 0, "an unfinished key after a refused Release")
	}
	refused(stepAcq(key, ""), "an empty owner, on an unfinished key")
	e.resumes(st, key, "owner-a", []byte("p1"), 0, "an unfinished key after a refused Acquire")

	for _, limit := range []int{0, -1, 1001} {
		var err error
		within(t, 10*time.Second, "Abandoned", func() {
			_, err = st.Abandoned(e.ctx, idempotency.AbandonedQuery{MaxTries: 1, Limit: limit})
		})
		if !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Fatalf("Abandoned with Limit %d: got %v, want an error wrapping ErrInvalidConfig", limit, err)
		}
	}
	for _, limit := range []int{1, 1000} {
		if _, err := st.Abandoned(e.ctx, idempotency.AbandonedQuery{MaxTries: 1, Limit: limit}); err != nil {
			t.Fatalf("Abandoned with Limit %d: %v", limit, err)
		}
	}
}
