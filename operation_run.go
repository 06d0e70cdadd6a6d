package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/observe"
)

// Run runs op under key: at most once to the end per key, as seen by every
// caller of the key's store, resuming where an earlier run stopped.
//
//  1. New key: the steps run in order from the first, each Local step in a
//     transaction of its own that commits its recovery point; a Local step
//     directly before Finish shares Finish's transaction, which commits
//     both with the answer. input is saved with the key, for every run
//     that resumes it ([State.Input]).
//  2. Unfinished key, same fingerprint: the run resumes at the step after
//     the last recovery point committed (input is ignored: the saved one
//     is used). Completed key: the stored answer, Replayed true.
//  3. Other fingerprint: an error wrapping [ErrMismatch]; nothing runs.
//  4. Key held by a running caller (in this Guard, another Guard or
//     process, or a run whose lease has not ended): Run waits for it up to
//     [Config.WaitTimeout], as Do does, then [ErrInProgress]. A key held by
//     a run that started with another fingerprint gives [ErrMismatch] at
//     once, without the wait, when the store implements
//     [backend.KeyAdmin] (one Inspect tells).
//  5. A step's transient error: the key is released at its last recovery
//     point and Run returns an error wrapping [ErrUnfinished] and the
//     step's error. A [FinalAnswer] finishes the operation with its answer. So
//     does a run whose ctx ends, or whose store fails, between two steps
//     after it committed one: it releases the key when the store answers.
//  6. Store failures wrap [ErrStore]: retrying with the same key resumes.
//     A missing table or column gives [ErrSchema] instead.
//  7. A key deleted while its run goes on ([Guard.Forget]): the run stops
//     with an error wrapping [ErrNotFound]; it never starts over.
//
// The store must implement [backend.Stepper] (the SQL stores do); others give an
// error wrapping [errors.ErrUnsupported]. op is checked first: a bad one
// gives [ErrInvalidConfig] and nothing is written.
func (g *Guard[Tx]) Run(ctx context.Context, key Key, fingerprint string, input []byte, op *Operation[Tx]) (Response, error) {
	if err := op.checkInput(ctx, input); err != nil {
		return Response{}, err // before the key is taken: nothing stored
	}
	start := time.Now()
	resp, step, err := g.runOp(ctx, key, fingerprint, input, op, false)
	if g.cfg.Observer != nil {
		ev := observe.Event{Key: key, Outcome: runOutcome(resp, err), Duration: time.Since(start), Attempts: 1, Err: err, Step: step}
		if op != nil {
			ev.Operation, ev.TTL = op.Name, g.cfg.TTL
		}
		g.cfg.Observer(ctx, ev)
	}
	return resp, err
}

func runOutcome(resp Response, err error) observe.Outcome {
	if errors.Is(err, ErrUnfinished) {
		return observe.Unfinished
	}
	return outcomeOf(resp, err)
}

// runOp is Run without the observer; resume is set for the [Completer],
// which never starts a new key. step is where the run ended.
func (g *Guard[Tx]) runOp(ctx context.Context, key Key, fp string, input []byte, op *Operation[Tx], resume bool) (resp Response, step string, err error) {
	if err := key.Validate(); err != nil {
		return Response{}, "", err
	}
	if err := validateFingerprint(fp); err != nil {
		return Response{}, "", err
	}
	if err := op.validate(); err != nil {
		return Response{}, "", err
	}
	if _, err := (progress{Op: op.Name, Input: input}).encode(); err != nil {
		return Response{}, "", err
	}
	if _, err := g.dataSealer(); err != nil {
		return Response{}, "", err
	}
	ss, ok := g.store.(backend.Stepper[Tx])
	if !ok {
		return Response{}, "", fmt.Errorf("idempotency: the store %T does not run operations (no backend.Stepper): %w", g.store, errors.ErrUnsupported)
	}
	defer func() {
		if cerr := ctx.Err(); err != nil && cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w (%w)", err, cerr)
		}
		if err != nil {
			err = &backend.KeyError{Key: key, Err: err}
		}
	}()
	deadline := time.Now().Add(g.cfg.WaitTimeout)
	for {
		c, lead := g.join(key)
		if !lead {
			if resume {
				return Response{}, "", errRunning // the Completer does not wait
			}
			resp, handed, err := g.follow(ctx, c, fp, deadline)
			if err != nil || handed {
				return resp, "", err
			}
			continue
		}
		r := &runner[Tx]{g: g, ss: ss, op: op, c: c, key: key, fp: fp, input: input, resume: resume, deadline: deadline}
		return r.lead(ctx)
	}
}

// runner is the one run of an operation that drives a key for the callers
// of a Guard.
type runner[Tx any] struct {
	g        *Guard[Tx]
	ss       backend.Stepper[Tx]
	op       *Operation[Tx]
	c        *call
	key      Key
	fp       string
	input    []byte
	resume   bool
	deadline time.Time
	owner    string

	st        *State // nil until the first phase; then the run's state
	saved     []byte // the progress last committed, by this run or the one it resumed
	conflicts int    // commits retried after a conflict
	// leased: this run's last commit (a Save) took the lease, and no
	// Foreign call ran since. Only then does a Foreign step run without a
	// phase of its own first.
	leased bool
	// mine: this run committed a Save, so the lease it ends on a failure
	// is its own.
	mine bool
	// split: Finish failed in the phase of the last Local step
	// ([runner.finishMerged]); the step then commits its recovery point
	// and Finish runs in a phase of its own, as they did before the merge.
	split bool
}

func (r *runner[Tx]) lead(ctx context.Context) (resp Response, step string, err error) {
	handed := false
	defer func() {
		if !handed {
			r.g.leave(r.key, r.c, nil)
		}
	}()
	r.owner = newOwner()
	resp, err = r.drive(ctx)
	if r.st != nil {
		step = r.st.p.Step
	}
	if err != nil && r.mine && !errors.Is(err, ErrUnfinished) && r.release(ctx, step, err) == released {
		// The run stopped between two phases (its ctx ended, the store
		// failed, a commit's outcome is unknown) with the key unfinished
		// and its lease this run's: the lease ended now, so that a retry
		// resumes at once rather than when the lease runs out.
		err = r.unfinishedErr(step, err)
	}
	if err != nil {
		return Response{}, step, err
	}
	handed = true
	r.g.leave(r.key, r.c, &answer{fp: r.fp, resp: resp})
	return resp, step, nil
}

// newOwner returns a random token naming one run.
func newOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}
