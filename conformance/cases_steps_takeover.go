package conformance

import (
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

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
	big := make([]byte, backend.MaxProgressLen)
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
		p   backend.Phase[Tx]
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
	var sts []backend.Stepper[Tx]
	for _, store := range e.instances(storeInstances) {
		st, ok := store.(backend.Stepper[Tx])
		if !ok {
			t.Fatalf("Fixture.Reopen gave a %T, which does not implement backend.Stepper as the fixture's store does", store)
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
