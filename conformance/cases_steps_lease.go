package conformance

import (
	"errors"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// stepShortLease is the lease of StepsHoldRunsOutMidStep's phases (at
// least [Features].MinLease).
const stepShortLease = 300 * time.Millisecond

// stepsHoldRunsOut: a phase outlives its lease, on the store's own clock.
// Another owner may then take the key (a store that holds a phase by its
// lease alone, such as etcd) or is refused (one that holds it in a
// transaction). Either way at most one of the two phases commits: once
// another owner took the key, the stale phase's Save, Release or Complete
// returns an error wrapping ErrLeaseLost and commits nothing of it.
// Round 1 is a new key and Save; round 2 an unfinished key and Release;
// round 3 an unfinished key and Complete.
func (s *suite[Tx]) stepsHoldRunsOut(t *testing.T) {
	s.need(t, "Stepper")
	e := s.setup(t, Options{})
	st := e.stepper()
	f := s.h.Features
	lease := f.leaseOf(stepShortLease)
	for round, end := range []string{"Save", "Release", "Complete"} {
		key, tagA, tagB := idempotency.Key{ID: uniq("mid")}, uniq("a"), uniq("b")
		wantTries := 0
		if round > 0 { // an unfinished key, released once by an earlier run
			p0 := e.phase(st, stepAcq(key, "owner-0"), "a new key")
			if err := p0.Release(e.ctx, []byte("p0")); err != nil {
				t.Fatalf("round %d: Release of an earlier run: %v", round+1, err)
			}
			wantTries = 1
		}
		a := stepAcq(key, "owner-a")
		a.Lease = lease
		pa := e.phase(st, a, "owner A")
		e.effect(pa.Tx(), tagA)
		time.Sleep(lease + f.slack() + 50*time.Millisecond) // A's hold runs out mid-step
		b := stepAcq(key, "owner-b")
		b.Deadline = time.Now().Add(time.Second) // a store that waits for a lock on a first try
		var (
			pb  backend.Phase[Tx]
			rec *backend.Record
			err error
		)
		within(t, heldBound+10*time.Second, "Acquire by owner B", func() { pb, rec, err = e.acquireRetrying(st, b, heldBound) })
		if pb == nil && (rec != nil || !errors.Is(err, idempotency.ErrInProgress)) {
			_ = pa.Rollback(e.ctx)
			t.Fatalf("round %d: Acquire by B while A's phase is open past its %v lease: %+v, %v; want a Phase or ErrInProgress", round+1, lease, rec, err)
		}
		if pb != nil {
			e.effect(pb.Tx(), tagB)
			if err := pb.Save(e.ctx, []byte("b-1")); err != nil {
				t.Fatalf("round %d: B's Save after it took over A's ended lease: %v", round+1, err)
			}
		}
		var aerr error
		switch end {
		case "Save":
			aerr = pa.Save(e.ctx, []byte("a-1"))
		case "Release":
			aerr = pa.Release(e.ctx, []byte("a-1"))
		default:
			aerr = pa.Complete(e.ctx, created(tagA, 1))
		}
		if pb != nil {
			// On several primaries ([Features].MultiPrimary) certification
			// refuses the later commit: ErrConflict, nothing committed.
			refused := errors.Is(aerr, backend.ErrLeaseLost) || (f.MultiPrimary && errors.Is(aerr, backend.ErrConflict))
			if !refused {
				t.Fatalf("round %d: A's %s after its %v lease ran out mid-step and B took the key and saved: %v; want an error wrapping ErrLeaseLost, "+
					"and nothing of A committed (a phase checks that it still holds the key when it commits)", round+1, end, lease, aerr)
			}
			e.count(tagA, 0, "the stale phase's writes")
			e.count(tagB, 1, "the writes of the phase that took the key over")
			e.resumes(st, key, "owner-b", []byte("b-1"), wantTries, "the key after the stale phase's "+end)
			continue
		}
		// A's transaction held the key past its lease: its phase commits.
		if aerr != nil {
			t.Fatalf("round %d: A's %s, no other run having taken the key: %v", round+1, end, aerr)
		}
		e.count(tagA, 1, "the phase that kept its key")
		switch end {
		case "Save":
			e.resumes(st, key, "owner-a", []byte("a-1"), wantTries, "the key A saved")
		case "Release":
			e.resumes(st, key, "owner-b", []byte("a-1"), wantTries+1, "the key A released")
		default:
			p, rec, err := st.Acquire(e.ctx, stepAcq(key, "owner-c"))
			if p != nil {
				_ = p.Rollback(e.ctx)
			}
			if err != nil || rec == nil || !sameResponse(idempotency.Response{Status: rec.Status, Header: rec.Header, Body: rec.Body}, created(tagA, 1)) {
				t.Fatalf("round %d: the key A completed: Acquire got %v, %+v, %v; want A's answer", round+1, p, rec, err)
			}
		}
	}
}
