package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency/backend"
)

// drive runs the operation's steps from where the key stands to the end.
func (r *runner[Tx]) drive(ctx context.Context) (Response, error) {
	var (
		open backend.Phase[Tx] // a phase whose transaction is open, if any
		stop *Response         // a Foreign step's Stop, to complete in the next phase
	)
	for {
		if open == nil && r.leased && r.nextIsForeign() {
			// This run's last commit took the lease: the call needs no
			// transaction. A next step that is Foreign too takes the lease
			// again first, committing this one's data.
			i, _ := r.op.index(r.st.p.Step)
			r.leased = false
			resp, err := r.foreign(ctx, i)
			if err != nil {
				return Response{}, err
			}
			stop = resp
			continue
		}
		if open == nil {
			ph, rec, err := r.acquire(ctx)
			switch {
			case err != nil:
				return Response{}, err
			case rec != nil:
				if rec.Fingerprint != r.fp {
					return Response{}, ErrMismatch
				}
				return r.g.replay(ctx, r.key, rec) // Config.Codec
			}
			// Whether another run moved the key on matters only to a
			// pending Stop: compared before adopt takes the new state.
			moved := stop != nil && !samePoint(ph.Progress(), r.saved)
			if err := r.adopt(ctx, ph); err != nil {
				_ = ph.Rollback(context.WithoutCancel(ctx))
				return Response{}, err
			}
			open = ph
			if stop != nil {
				resp := *stop
				stop = nil
				if !moved {
					ph, open = open, nil
					return r.complete(ctx, ph, resp)
				}
				// Another run took the key over while this run's call
				// outlasted its lease, and moved it on: the Stop no longer
				// applies. Resume from what that run committed.
			}
			if r.saved == nil && r.op.Durable && !r.nextIsForeign() {
				// A new key: commit it before its first step.
				err := r.save(ctx, open, r.st.p)
				open = nil
				if err != nil && !r.conflicted(ctx, err) {
					return Response{}, err
				}
				continue
			}
		}
		i, err := r.op.index(r.st.p.Step)
		if err != nil {
			_ = open.Rollback(context.WithoutCancel(ctx))
			return Response{}, err
		}
		if i == len(r.op.Steps) {
			before := r.st.p.clone()
			resp, err := r.finish(ctx, open)
			open = nil
			if err != nil && errors.Is(err, backend.ErrConflict) {
				r.st.p = before // Finish runs again, from the same state
				if r.conflicted(ctx, err) {
					continue
				}
			}
			return resp, err
		}
		st := r.op.Steps[i]
		if st.Foreign != nil {
			// Commit what the phase holds (a new key, a taken lease, a
			// Foreign step's data) before the call: no transaction stays
			// open across it.
			err := r.save(ctx, open, r.st.p)
			open = nil
			if err != nil && !r.conflicted(ctx, err) {
				return Response{}, err
			}
			continue // to the call, if the lease is this run's
		}
		// A Local step that sets data and whose commit then fails with a
		// conflict runs again from the state it started from: its writes
		// were rolled back, so must be what it set.
		before := r.st.p.clone()
		r.st.p.Step = st.Name
		if err := st.Local(ctx, open.Tx(), r.st); err != nil {
			if !r.isConflict(err) {
				return r.failed(ctx, open, err)
			}
			// A statement of the step met a conflict (a deadlock, a
			// serialization failure, a certification abort): the step runs
			// again in a new phase, from the state it started from.
			_ = open.Rollback(context.WithoutCancel(ctx))
			open = nil
			r.st.p = before
			if !r.conflicted(ctx, fmt.Errorf("%w: %w", backend.ErrConflict, err)) {
				if r.st == nil { // a new key: nothing committed
					r.st = &State{key: r.key, p: before}
				}
				return r.failed(ctx, nil, err)
			}
			continue
		}
		next := r.st.p.clone()
		next.Step = r.nextName(i)
		if _, err := next.encode(); err != nil {
			// Checked even when Finish comes next and no progress is
			// saved: a step data too large fails as it does before a Save.
			return r.failed(ctx, open, err)
		}
		if next.Step == "" && r.merges() {
			ph := open
			open = nil
			resp, again, err := r.finishMerged(ctx, ph, before)
			if again {
				continue
			}
			return resp, err
		}
		err = r.save(ctx, open, next)
		open = nil
		if err != nil {
			r.st.p = before
			if !r.conflicted(ctx, err) {
				return Response{}, err
			}
		}
	}
}

// merges reports whether Finish runs in the phase of the Local step just
// before it ([runner.finishMerged]): yes, unless Finish failed there once in
// this run (split) or the run met a conflict. Under contention the step
// and Finish commit one by one: a conflict of Finish in the merged phase
// would run the step again too, and shorter transactions hold their locks
// for less long.
func (r *runner[Tx]) merges() bool {
	return !r.split && r.conflicts == 0
}

// finishMerged runs Finish in ph, the open phase of the operation's last
// Local step, which succeeded, and completes the key there: one commit
// holds the step's writes, Finish's and the answer, where a step followed by
// another commits its recovery point first. before is the state from before
// the step. No progress is written, so none is sealed (Config.Codec); the
// answer is, by complete.
//
// Failures keep what the split path gives (the step's Save, then Finish in
// a phase of its own):
//
//   - A [FinalAnswer] completes the key in ph, with the step's writes.
//   - A conflict of Finish's (or of the commit): ph is rolled back, the
//     state is before's, and drive runs the step again, within the
//     conflict retries (split from then on: see merges).
//   - Any other error of Finish, or an answer that cannot be stored (a bad
//     status, a Codec that fails): ph is rolled back, with the step's
//     writes, and the run goes on split: the step runs again in a phase
//     of its own and its recovery point commits, then Finish runs in its
//     own phase and fails as it would have (the key is unfinished at
//     Finish, with ErrUnfinished naming Finish), or succeeds. The step's
//     writes still commit once: the first ones were rolled back. A run
//     whose ctx has ended cannot go on: it fails at the step, whose
//     recovery point is where the key stays.
//
// retry says the phase was rolled back and drive goes on.
func (r *runner[Tx]) finishMerged(ctx context.Context, ph backend.Phase[Tx], before progress) (resp Response, retry bool, err error) {
	resp, conflict, err := r.runFinish(ctx, ph)
	if conflict {
		r.st.p = before
		if r.conflicted(ctx, fmt.Errorf("%w: %w", backend.ErrConflict, err)) {
			return Response{}, true, nil
		}
		if r.st == nil { // a new key: nothing committed
			r.st = &State{key: r.key, p: before}
		}
		resp, err = r.failed(ctx, nil, err)
		return resp, false, err
	}
	if err == nil {
		var stored Response
		if resp, stored, err = r.answer(ctx, resp); err == nil {
			resp, err = r.commit(ctx, ph, resp, stored)
			if err != nil {
				// Nothing committed (or the outcome is unknown): the key
				// stands where it stood before the step.
				r.st.p = before
				if errors.Is(err, backend.ErrConflict) && r.conflicted(ctx, err) {
					return Response{}, true, nil
				}
			}
			return resp, false, err
		}
	}
	_ = ph.Rollback(context.WithoutCancel(ctx))
	r.st.p = before
	if ctx.Err() != nil {
		resp, err = r.failed(ctx, nil, err)
		return resp, false, err
	}
	r.split = true
	return Response{}, true, nil
}

// conflicted reports whether err, a phase's failed commit, is a conflict
// to retry from a new phase (the commit applied nothing: the step runs
// again), and waits the backoff before it. A run that had committed
// nothing yet forgets its state: another run may have taken the key (a
// certification conflict on a multi-primary cluster), which the next
// phase then waits for.
func (r *runner[Tx]) conflicted(ctx context.Context, err error) bool {
	if !errors.Is(err, backend.ErrConflict) || r.conflicts >= r.g.cfg.MaxRetries {
		return false
	}
	r.conflicts++
	r.leased = false
	if r.saved == nil {
		r.st = nil
	}
	return sleep(ctx, backoff(r.g.cfg.RetryBackoff, r.conflicts)) == nil
}

// nextIsForeign reports whether the step the run resumes at is Foreign.
func (r *runner[Tx]) nextIsForeign() bool {
	i, err := r.op.index(r.st.p.Step)
	return err == nil && i < len(r.op.Steps) && r.op.Steps[i].Foreign != nil
}

// nextName is the name of the step after step i ("" for Finish).
func (r *runner[Tx]) nextName(i int) string {
	if i+1 < len(r.op.Steps) {
		return r.op.Steps[i+1].Name
	}
	return ""
}

// foreign runs Foreign step i outside any transaction. Its data is kept
// in memory until the next phase commits it. A Stop gives its answer,
// which the next phase completes the key with.
func (r *runner[Tx]) foreign(ctx context.Context, i int) (*Response, error) {
	st := r.op.Steps[i]
	r.st.p.Step = st.Name
	data := clonedData(r.st.p.Data)
	err := st.Foreign(ctx, r.st)
	var stop *stopError
	if errors.As(err, &stop) {
		r.st.p.Data = data // what the call set is not committed
		return &stop.Response, nil
	}
	if err != nil {
		r.st.p.Data = data
		_, ferr := r.failed(ctx, nil, err)
		return nil, ferr
	}
	r.st.p.Step = r.nextName(i)
	return nil, nil
}

// runFinish runs Finish in ph and returns its answer: a [FinalAnswer]'s
// as an answer. When Finish's statement met a conflict, it rolls ph back
// and reports conflict, with Finish's error.
func (r *runner[Tx]) runFinish(ctx context.Context, ph backend.Phase[Tx]) (resp Response, conflict bool, err error) {
	r.st.p.Step = ""
	resp, err = r.op.Finish(ctx, ph.Tx(), r.st)
	var stop *stopError
	if errors.As(err, &stop) {
		return stop.Response, false, nil
	}
	if err != nil && r.isConflict(err) {
		_ = ph.Rollback(context.WithoutCancel(ctx))
		return Response{}, true, err
	}
	return resp, false, err
}

// finish runs Finish in ph and completes the key with its answer.
func (r *runner[Tx]) finish(ctx context.Context, ph backend.Phase[Tx]) (Response, error) {
	resp, conflict, err := r.runFinish(ctx, ph)
	if conflict { // drive runs it again
		return Response{}, fmt.Errorf("%w: %w", backend.ErrConflict, err)
	}
	if err != nil {
		return r.failed(ctx, ph, err)
	}
	return r.complete(ctx, ph, resp)
}

// isConflict reports whether err, a step's or Finish's, is a conflict
// that the store classifies as retryable ([backend.ConflictClassifier]), as
// [Guard.Do] retries fn's: never a [FinalAnswer].
func (r *runner[Tx]) isConflict(err error) bool {
	var stop *stopError
	if errors.As(err, &stop) {
		return false
	}
	cc, ok := r.g.store.(backend.ConflictClassifier)
	return ok && cc.IsConflict(err)
}

// complete stores resp as the key's answer in ph.
func (r *runner[Tx]) complete(ctx context.Context, ph backend.Phase[Tx], resp Response) (Response, error) {
	resp, stored, err := r.answer(ctx, resp)
	if err != nil {
		_ = ph.Rollback(context.WithoutCancel(ctx))
		return Response{}, err
	}
	return r.commit(ctx, ph, resp, stored)
}

// answer checks resp, an answer to store, and seals it (Config.Codec): it
// returns resp cut to what is stored, and stored, what the store gets.
func (r *runner[Tx]) answer(ctx context.Context, resp Response) (out, stored Response, err error) {
	if resp.Status < 100 || resp.Status > 599 {
		return Response{}, Response{}, fmt.Errorf("%w: status %d outside 100..599", ErrInvalidResponse, resp.Status)
	}
	// Only status, header and body are stored: the store gets no more.
	resp = Response{Status: resp.Status, Header: resp.Header, Body: resp.Body}
	stored, err = r.g.seal(ctx, r.key, resp) // Config.Codec
	if err != nil {
		return Response{}, Response{}, err
	}
	return resp, stored, nil
}

// commit completes the key in ph with stored, resp as answer sealed: it
// returns resp with its TTL and expiry.
func (r *runner[Tx]) commit(ctx context.Context, ph backend.Phase[Tx], resp, stored Response) (Response, error) {
	now := time.Now().Round(0) // before Complete: no later than the store's clock at completion
	if err := ph.Complete(ctx, stored); err != nil {
		return Response{}, r.storeErr(err)
	}
	ttl := r.g.cfg.TTL
	resp.TTL, resp.ExpiresAt = ttl, backend.Expiry(now, ttl).Truncate(time.Millisecond)
	return resp, nil
}

// failed handles a step's error: a Stop finishes the operation in ph (a
// Local step's writes commit with its answer); any other error rolls ph
// back and releases the key at its last recovery point. ph is nil after a
// Foreign step.
func (r *runner[Tx]) failed(ctx context.Context, ph backend.Phase[Tx], err error) (Response, error) {
	var stop *stopError
	if ph != nil && errors.As(err, &stop) {
		return r.complete(ctx, ph, stop.Response)
	}
	if ph != nil {
		_ = ph.Rollback(context.WithoutCancel(ctx))
	}
	step := r.st.p.Step
	if r.release(ctx, step, err) == gone {
		return Response{}, fmt.Errorf("%w: operation %q, step %s failed (%w) after the key's unfinished operation was deleted (forgotten, or completed and expired): nothing is left to resume", ErrNotFound, r.op.Name, stepName(step), err)
	}
	return Response{}, r.unfinishedErr(step, err)
}

// stepName is step as errors name it: "Finish" for "".
func stepName(step string) string {
	if step == "" {
		return "Finish"
	}
	return step
}

// unfinishedErr is Run's error for a run that stopped at step with err,
// leaving the key at its last recovery point.
func (r *runner[Tx]) unfinishedErr(step string, err error) error {
	return fmt.Errorf("%w: operation %q, step %s: %w", ErrUnfinished, r.op.Name, stepName(step), err)
}
