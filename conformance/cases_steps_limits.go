package conformance

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// stepsOneConnection: phases of many keys at once on a pool of two
// connections; no method asks for a second connection while it holds
// one, so none deadlocks.
func (s *suite[Tx]) stepsOneConnection(t *testing.T) {
	s.need(t, "Stepper")
	e := s.setup(t, Options{MaxConns: 2})
	st := e.stepper()
	ad, _ := e.f.Store.(backend.KeyAdmin)
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
				var p backend.Phase[Tx]
				p, _, err = e.acquireRetrying(st, waiting(stepAcq(shared, fmt.Sprint("owner-", i)), 10*time.Second), 10*time.Second)
				switch {
				case p != nil:
					if err = e.f.Effect(e.ctx, p.Tx(), sharedTag); err != nil {
						_ = p.Rollback(e.ctx)
						if cc, ok := e.f.Store.(backend.ConflictClassifier); ok && cc.IsConflict(err) {
							err = fmt.Errorf("%w: %w", backend.ErrConflict, err)
						}
					} else if err = p.Save(e.ctx, []byte("shared")); err == nil {
						won.Add(1)
					}
				case errors.Is(err, idempotency.ErrInProgress):
					err = nil
				}
				if !errors.Is(err, backend.ErrConflict) {
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
func (e *env[Tx]) poolPhases(st backend.Stepper[Tx], ad backend.KeyAdmin, key idempotency.Key, tag, owner string) error {
	for i := range 3 {
		// A commit that meets a conflict (a serialization failure under
		// SERIALIZABLE) applied nothing: the phase is tried again, as the
		// core tries it.
		var err error
		for range 10 {
			if err = e.poolPhase(st, ad, key, tag, owner, i); !errors.Is(err, backend.ErrConflict) {
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
func (e *env[Tx]) poolPhase(st backend.Stepper[Tx], ad backend.KeyAdmin, key idempotency.Key, tag, owner string, i int) error {
	a := waiting(stepAcq(key, owner), 10*time.Second)
	p, rec, err := e.acquireRetrying(st, a, 10*time.Second)
	if err != nil || p == nil {
		return fmt.Errorf("phase %d: Acquire got %v, %+v, %v; want a Phase", i, p, rec, err)
	}
	if err := e.f.Effect(e.ctx, p.Tx(), tag); err != nil {
		_ = p.Rollback(e.ctx)
		if cc, ok := e.f.Store.(backend.ConflictClassifier); ok && cc.IsConflict(err) {
			err = fmt.Errorf("%w: %w", backend.ErrConflict, err)
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
	// The reads after the phase are retried on their own: a conflict of a
	// read (a serialization failure of a read-only transaction under
	// SERIALIZABLE) must not run the committed phase again.
	read := func(what string, f func() error) error {
		var err error
		for range 10 {
			if err = f(); !errors.Is(err, backend.ErrConflict) {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("%s after phase %d: %v", what, i, err)
		}
		return nil
	}
	if err := read("Abandoned", func() error {
		_, err := st.Abandoned(e.ctx, backend.AbandonedQuery{MaxTries: 10, Limit: 5})
		return err
	}); err != nil {
		return err
	}
	if ad != nil {
		return read("Inspect", func() error {
			_, err := ad.Inspect(e.ctx, key, true)
			return err
		})
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
	refused := func(a backend.Acquisition, what string) {
		t.Helper()
		var (
			p   backend.Phase[Tx]
			rec *backend.Record
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
	}{{"nil progress", nil}, {"MaxProgressLen+1 bytes of progress", make([]byte, backend.MaxProgressLen+1)}} {
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
	}{{"nil progress", nil}, {"MaxProgressLen+1 bytes of progress", make([]byte, backend.MaxProgressLen+1)}} {
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
			_, err = st.Abandoned(e.ctx, backend.AbandonedQuery{MaxTries: 1, Limit: limit})
		})
		if !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Fatalf("Abandoned with Limit %d: got %v, want an error wrapping ErrInvalidConfig", limit, err)
		}
	}
	for _, limit := range []int{1, 1000} {
		if _, err := st.Abandoned(e.ctx, backend.AbandonedQuery{MaxTries: 1, Limit: limit}); err != nil {
			t.Fatalf("Abandoned with Limit %d: %v", limit, err)
		}
	}
}
