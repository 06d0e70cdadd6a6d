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

// Operation is a sequence of named steps run under one idempotency key, for
// work that one transaction cannot hold: a payment that writes its order,
// calls a card processor, records the processor's answer, then queues an
// e-mail. Run it with [Guard.Run].
//
// A Local step is one transaction of the store, on the row that holds the
// key: the step's writes through tx, its recovery point (the next step)
// and the step data ([State]) commit together. A Foreign step calls another
// system outside any transaction, with a key derived from the idempotency
// key ([Key.Derive]) that the other system deduplicates on; the data it
// sets in State is committed by the next Local step, or by Finish. Finish
// is the last local phase: it returns the answer, stored with the key and
// replayed to every later call, as [Guard.Do] does.
//
// A retry with the same key (a client's, or the [Completer]'s) resumes
// after the last recovery point committed: a committed Local step never
// runs again; a Foreign step may run again after a crash or a failure, with
// the same derived key, so it must be idempotent at the other end.
//
// Steps are found by name when a run resumes, so a deploy may add steps
// after the one a key stopped at, but must not rename or remove a step
// that unfinished keys may still resume at.
type Operation[Tx any] struct {
	// Name identifies the operation in the store, so that the [Completer]
	// knows which one to resume: 1 to 64 bytes of printable ASCII.
	Name string
	// Steps run in order, each exactly once to commit.
	Steps []Step[Tx]
	// Finish runs in the last transaction and returns the answer, which
	// commits with its writes and the completed key. Required.
	Finish func(ctx context.Context, tx Tx, s *State) (Response, error)
	// Durable commits a new key, with its input, before the first step
	// runs, at the cost of one more transaction: the operation is then in
	// the store from its start, so a run that dies or fails in its first
	// step leaves it unfinished, for a retry or the [Completer], where it
	// otherwise leaves the key free (nothing was committed). An operation
	// whose first step is Foreign is committed before it anyway.
	Durable bool
	// Lease is how long a run holds the key after each commit, by the
	// store's clock. While it lasts, other processes wait for the run or
	// get [ErrInProgress]; a run that died (a crash, a kill) holds the key
	// until it ends. Make it longer than the slowest Foreign step. Defaults
	// to one minute.
	Lease time.Duration
	// Validate, if set, checks the input of [Guard.Run] before the key is
	// taken: an error returns from Run as an *[inputError] (it matches
	// [ErrInvalidInput]) with nothing stored, so the corrected request
	// with the same key runs. (A step's [FinalAnswer] with a 400 is stored, and
	// the corrected retry, another fingerprint, gets [ErrMismatch].) It
	// runs on every call of Run, not when the [Completer] resumes a key:
	// keep it accepting what it accepted before.
	Validate func(ctx context.Context, input []byte) error
}

// defaultLease is the [Operation.Lease] used when it is zero.
const defaultLease = time.Minute

// maxOperationName is the longest [Operation.Name] and step name.
const maxOperationName = 64

// Step is one step of an [Operation]: exactly one of Local or Foreign is
// set.
//
// A step that returns an error made with [FinalAnswer] finishes the operation with
// that answer (a processor's decline, for instance): a Local step's
// writes commit with it. Any other error is transient: a Local step's
// writes roll back, the key stays at the last recovery point, and
// [Guard.Run] returns an error wrapping [ErrUnfinished].
type Step[Tx any] struct {
	// Name is the step's recovery point: 1 to 64 bytes of printable
	// ASCII, unique in the operation.
	Name string
	// Local runs in a transaction of the store, on tx.
	Local func(ctx context.Context, tx Tx, s *State) error
	// Foreign runs outside any transaction: a call to another system.
	Foreign func(ctx context.Context, s *State) error
}

// FinalAnswer returns an error that finishes an [Operation] with resp as its
// stored answer: a permanent outcome, such as a declined card.
func FinalAnswer(resp Response) error { return &stopError{Response: resp} }

// stopError is the error [FinalAnswer] returns.
type stopError struct {
	// Response is the operation's answer.
	Response Response
}

func (e *stopError) Error() string {
	return fmt.Sprintf("idempotency: operation stopped with status %d", e.Response.Status)
}

// State is what the steps of one run of an [Operation] share: the key, the
// caller's input and the step data, saved with every recovery point. It is
// used by one step at a time.
type State struct {
	key   Key
	tries int
	p     progress
}

// Key returns the operation's key. Derive the key of a foreign call from
// it: s.Key().Derive("charge").
func (s *State) Key() Key { return s.key }

// Input returns the input the operation was started with ([Guard.Run]),
// the same bytes in every run that resumes it. Do not change them.
func (s *State) Input() []byte { return s.p.Input }

// Get returns the value a step set for name, "" if none.
func (s *State) Get(name string) string { return s.p.Data[name] }

// Set records value for name: committed with the next recovery point. Keep
// it small (an id, a status): the whole progress of an operation is at most
// [backend.MaxProgressLen] bytes.
func (s *State) Set(name, value string) {
	if s.p.Data == nil {
		s.p.Data = map[string]string{}
	}
	s.p.Data[name] = value
}

// Step returns the name of the step running ("" in Finish).
func (s *State) Step() string { return s.p.Step }

// Tries returns how many runs of the operation failed before this one.
func (s *State) Tries() int { return s.tries }

// validate checks op before anything is written.
func (op *Operation[Tx]) validate() error {
	if op == nil {
		return fmt.Errorf("%w: nil operation", ErrInvalidConfig)
	}
	if err := checkName(op.Name); err != nil {
		return fmt.Errorf("%w: operation name: %w", ErrInvalidConfig, err)
	}
	if op.Finish == nil {
		return fmt.Errorf("%w: operation %q: nil Finish", ErrInvalidConfig, op.Name)
	}
	if op.Lease < 0 || (op.Lease > 0 && op.Lease < time.Millisecond) {
		return fmt.Errorf("%w: operation %q: Lease %v under 1ms", ErrInvalidConfig, op.Name, op.Lease)
	}
	seen := map[string]bool{}
	for i, st := range op.Steps {
		if err := checkName(st.Name); err != nil {
			return fmt.Errorf("%w: operation %q: step %d: %w", ErrInvalidConfig, op.Name, i, err)
		}
		if seen[st.Name] {
			return fmt.Errorf("%w: operation %q: two steps named %q", ErrInvalidConfig, op.Name, st.Name)
		}
		seen[st.Name] = true
		if (st.Local == nil) == (st.Foreign == nil) {
			return fmt.Errorf("%w: operation %q: step %q needs exactly one of Local and Foreign", ErrInvalidConfig, op.Name, st.Name)
		}
	}
	return nil
}

func checkName(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > maxOperationName:
		return fmt.Errorf("%d bytes, longer than %d", len(s), maxOperationName)
	}
	if i := indexNotPrintable(s); i >= 0 {
		return fmt.Errorf("byte %d is %#02x, not printable ASCII", i, s[i])
	}
	return nil
}

// ttl is the TTL of the operation's answer under g: the Guard's, as for
// its calls of Do (run the operation on a [Guard.WithTTL] view to keep its
// keys longer or shorter).
func (op *Operation[Tx]) ttl(g *Guard[Tx]) time.Duration { return g.cfg.TTL }

func (op *Operation[Tx]) lease() time.Duration {
	if op.Lease == 0 {
		return defaultLease
	}
	return op.Lease
}

// index returns the position of the step named name; len(op.Steps) for ""
// (Finish).
func (op *Operation[Tx]) index(name string) (int, error) {
	if name == "" {
		return len(op.Steps), nil
	}
	for i, st := range op.Steps {
		if st.Name == name {
			return i, nil
		}
	}
	return 0, fmt.Errorf("%w: operation %q has no step %q, where the key stopped (was the step renamed or removed?)", ErrInvalidConfig, op.Name, name)
}

// Run runs op under key: at most once to the end per key, as seen by every
// caller of the key's store, resuming where an earlier run stopped.
//
//  1. New key: the steps run in order from the first, each Local step in a
//     transaction of its own that commits its recovery point. input is
//     saved with the key, for every run that resumes it ([State.Input]).
//  2. Unfinished key, same fingerprint: the run resumes at the step after
//     the last recovery point committed (input is ignored: the saved one
//     is used). Completed key: the stored answer, Replayed true.
//  3. Other fingerprint: an error wrapping [ErrMismatch]; nothing runs.
//  4. Key held by a running caller (in this Guard, another Guard or
//     process, or a run whose lease has not ended): Run waits for it up to
//     [Config.WaitTimeout], as Do does, then [ErrInProgress].
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
	r.g.leave(r.key, r.c, &answer{fp: r.fp, resp: cloneResponse(resp)})
	return resp, step, nil
}

// newOwner returns a random token naming one run.
func newOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

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
			return r.failed(ctx, open, err)
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

// finish runs Finish in ph and completes the key with its answer.
func (r *runner[Tx]) finish(ctx context.Context, ph backend.Phase[Tx]) (Response, error) {
	r.st.p.Step = ""
	resp, err := r.op.Finish(ctx, ph.Tx(), r.st)
	var stop *stopError
	if errors.As(err, &stop) {
		resp, err = stop.Response, nil
	}
	if err != nil && r.isConflict(err) {
		// Finish's statement met a conflict: drive runs it again.
		_ = ph.Rollback(context.WithoutCancel(ctx))
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
	if resp.Status < 100 || resp.Status > 599 {
		_ = ph.Rollback(context.WithoutCancel(ctx))
		return Response{}, fmt.Errorf("%w: status %d outside 100..599", ErrInvalidResponse, resp.Status)
	}
	// Only status, header and body are stored: the store gets no more.
	resp = Response{Status: resp.Status, Header: resp.Header, Body: resp.Body}
	stored, err := r.g.seal(ctx, r.key, resp) // Config.Codec
	if err != nil {
		_ = ph.Rollback(context.WithoutCancel(ctx))
		return Response{}, err
	}
	now := time.Now().Round(0) // before Complete: no later than the store's clock at completion
	if err := ph.Complete(ctx, stored); err != nil {
		return Response{}, r.storeErr(err)
	}
	ttl := r.op.ttl(r.g)
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

// What [runner.release] found.
type releaseResult int

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
	a := backend.Acquisition{Reservation: backend.Reservation{Key: r.key, Fingerprint: r.fp, TTL: r.op.ttl(r.g), Wait: releaseWait, Deadline: time.Now().Add(releaseWait)},
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

// releaseTimeout bounds the release of a failed run, which outlives the
// caller's context; releaseWait, its wait for a row another caller holds.
const (
	releaseTimeout = 5 * time.Second
	releaseWait    = time.Second
)

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
	a := backend.Acquisition{Reservation: backend.Reservation{Key: r.key, Fingerprint: r.fp, TTL: r.op.ttl(r.g), NoWait: r.g.noWait, Deadline: r.deadline},
		Owner: r.owner, Lease: r.op.lease()}
	conflicts := 0
	poll := pollStart
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

// Polling of a key leased to another run.
const (
	pollStart = 5 * time.Millisecond
	pollMax   = 250 * time.Millisecond
)

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
