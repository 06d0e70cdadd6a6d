package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency/backend"
)

// What [runner.release] found.
type releaseResult int

// release ends the run's lease after a failure and counts a try, in a
// phase of its own, so that a retry resumes at once. It keeps the progress
// last committed, with the failure noted. A key with nothing committed
// (a new key whose first step failed) is left free.
func (r *runner[Tx]) release(ctx context.Context, step string, cause error) releaseResult {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	// Another caller may hold the row for a moment (it finds the lease
	// live and gives up): wait for it a little rather than leave the key
	// leased until the lease runs out.
	a := backend.Acquisition{Reservation: backend.Reservation{Key: r.key, Fingerprint: r.fp, TTL: r.g.cfg.TTL, Wait: releaseWait, Deadline: time.Now().Add(releaseWait)},
		Owner: r.owner, Lease: r.op.lease()}
	ph, rec, err := r.ss.Acquire(ctx, a)
	if err != nil || rec != nil {
		return notReleased // taken over, or finished by another run: nothing to release
	}
	raw := ph.Progress()
	p, err := decodeProgress(raw)
	switch {
	case raw == nil && r.saved == nil:
		_ = ph.Rollback(ctx) // a new key with nothing committed: left free
		return notReleased
	case raw == nil, ph.Fingerprint() != r.fp, err == nil && p.Op != r.op.Name:
		_ = ph.Rollback(ctx)
		return gone
	case err != nil:
		_ = ph.Rollback(ctx)
		return notReleased
	}
	p.Failure = failureText(step, cause)
	b, err := p.encode()
	if err != nil {
		_ = ph.Rollback(ctx)
		return notReleased
	}
	if ph.Release(ctx, b) != nil {
		return notReleased
	}
	return released
}

// maxFailure bounds the failure text saved with a released key.
const maxFailure = 512

func failureText(step string, err error) string {
	s := stepName(step) + ": " + err.Error()
	if len(s) > maxFailure {
		s = s[:maxFailure]
	}
	return s
}

// save commits ph with p as the key's progress.
func (r *runner[Tx]) save(ctx context.Context, ph backend.Phase[Tx], p progress) error {
	b, err := r.g.encodeProgress(ctx, r.key, p) // Config.Codec
	if err != nil {
		_ = ph.Rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := ph.Save(ctx, b); err != nil {
		r.leased = false
		return r.storeErr(err)
	}
	r.st.p, r.saved, r.leased, r.mine = p, b, true, true
	return nil
}

func (r *runner[Tx]) storeErr(err error) error {
	if errors.Is(err, ErrStore) || errors.Is(err, ErrSchema) { // ErrSchema: a retry does not help
		return err
	}
	return fmt.Errorf("%w: %w", ErrStore, err)
}

// acquire takes the key for the next phase: it retries conflicts and
// waits (polling) for a key held elsewhere, up to the wait bound.
func (r *runner[Tx]) acquire(ctx context.Context) (backend.Phase[Tx], *backend.Record, error) {
	a := backend.Acquisition{Reservation: backend.Reservation{Key: r.key, Fingerprint: r.fp, TTL: r.g.cfg.TTL, NoWait: r.g.noWait, Deadline: r.deadline},
		Owner: r.owner, Lease: r.op.lease()}
	conflicts := 0
	poll := pollStart
	looked := false // at the key's fingerprint (otherFingerprint)
	deadline := r.deadline
	if r.st != nil {
		// This run holds the key by its lease: another caller's phase may
		// hold the row for a moment (it finds the lease live and gives up),
		// or a run that took the key over after this run's lease ran out
		// drives it to the end. Either way, wait for it, as long as a call
		// waits for a held key.
		deadline = time.Now().Add(r.g.cfg.WaitTimeout)
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		ph, rec, err := r.ss.Acquire(ctx, a)
		if err == nil {
			return ph, rec, nil
		}
		var pause time.Duration
		switch {
		case errors.Is(err, backend.ErrConflict) && conflicts < r.g.cfg.MaxRetries:
			conflicts++
			pause = backoff(r.g.cfg.RetryBackoff, conflicts)
		case errors.Is(err, ErrInProgress) && (r.st != nil || !r.g.noWait && !r.resume):
			if r.st == nil && !looked {
				looked = true
				if r.otherFingerprint(ctx) {
					return nil, nil, fmt.Errorf("%w: the key's operation, in progress, started with another fingerprint", ErrMismatch)
				}
			}
			pause, poll = poll, min(2*poll, pollMax)
		case errors.Is(err, backend.ErrConflict):
			return nil, nil, r.storeErr(err)
		case errors.Is(err, ErrInProgress) || errors.Is(err, ErrInvalidConfig) || errors.Is(err, ErrInvalidKey):
			return nil, nil, err
		default:
			return nil, nil, r.storeErr(err)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, nil, fmt.Errorf("%w (the wait bound %v ran out)", err, r.g.cfg.WaitTimeout)
		}
		if werr := sleep(ctx, min(pause, left)); werr != nil {
			return nil, nil, werr
		}
	}
}

// otherFingerprint reports whether the key that a first acquisition found
// held is an operation's (it has progress) that started with another
// fingerprint. Waiting for its lease would end in ErrMismatch (see adopt):
// an operation's fingerprint stays until its record is deleted. It looks
// once, with the store's Inspect (a read that takes no lock); a store
// without KeyAdmin, or an error, says no, and the caller waits as before.
func (r *runner[Tx]) otherFingerprint(ctx context.Context) bool {
	ka, ok := r.g.store.(backend.KeyAdmin)
	if !ok {
		return false
	}
	info, err := ka.Inspect(ctx, r.key, false)
	return err == nil && info != nil && info.Progress != nil && info.Fingerprint != r.fp &&
		(info.State == backend.KeyInProgress || info.State == backend.KeyUnfinished)
}

// adopt takes the state of the key from ph: a new one, or the one saved.
func (r *runner[Tx]) adopt(ctx context.Context, ph backend.Phase[Tx]) error {
	raw := ph.Progress()
	if raw == nil {
		if r.resume {
			return fmt.Errorf("%w: the key is no longer unfinished", ErrNotFound)
		}
		if r.saved != nil {
			// The row this run went on from is gone: forgotten by an
			// operator, or completed by another run and then expired or
			// purged. Starting over would repeat committed steps.
			return fmt.Errorf("%w: the key's unfinished operation was deleted (forgotten, or completed and expired) while this run went on with it; it stops here", ErrNotFound)
		}
		if ph.Fingerprint() != r.fp {
			return ErrMismatch
		}
		r.st = &State{key: r.key, p: progress{Op: r.op.Name, Input: r.input}}
		if len(r.op.Steps) > 0 {
			r.st.p.Step = r.op.Steps[0].Name
		}
		return nil
	}
	if ph.Fingerprint() != r.fp {
		return ErrMismatch
	}
	if r.st != nil && string(raw) == string(r.saved) {
		// Still as this run left it: keep the data of a Foreign step
		// that the next phase commits.
		r.st.tries = ph.Tries()
		return nil
	}
	p, err := decodeProgress(raw)
	if err != nil {
		return err
	}
	if p.Op != r.op.Name {
		return fmt.Errorf("%w: the key belongs to operation %q, not %q", ErrMismatch, p.Op, r.op.Name)
	}
	if p, err = r.g.openProgress(ctx, r.key, p); err != nil { // Config.Codec
		return err
	}
	p.Failure = ""
	r.st = &State{key: r.key, tries: ph.Tries(), p: p}
	r.saved = raw
	return nil
}

func clonedData(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// samePoint reports whether progress a and b stand at the same point
// with the same data: a failure noted by a run that released the key
// changes nothing else.
func samePoint(a, b []byte) bool {
	if string(a) == string(b) {
		return true
	}
	pa, errA := decodeProgress(a)
	pb, errB := decodeProgress(b)
	if errA != nil || errB != nil || a == nil || b == nil {
		return false
	}
	pa.Failure, pb.Failure = "", ""
	ea, errA := pa.encode()
	eb, errB := pb.encode()
	return errA == nil && errB == nil && string(ea) == string(eb)
}

const (
	// released: the key is unfinished at its last recovery point, its
	// lease ended now.
	released releaseResult = iota + 1
	// notReleased: the key is another run's (its lease is live), or
	// completed, or the store did not answer; or it is a new key with
	// nothing committed, left free.
	notReleased
	// gone: the key this run went on with is no longer its operation's:
	// deleted, or another request's (another fingerprint or operation).
	gone
)

// releaseTimeout bounds the release of a failed run, which outlives the
// caller's context; releaseWait, its wait for a row another caller holds.
const (
	releaseTimeout = 5 * time.Second
	releaseWait    = time.Second
)

// Polling of a key leased to another run.
const (
	pollStart = 5 * time.Millisecond
	pollMax   = 250 * time.Millisecond
)
