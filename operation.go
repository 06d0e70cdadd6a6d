package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency/internal/ascii"
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
// replayed to every later call, as [Guard.Do] does, for the Guard's TTL
// (run it on a [Guard.WithTTL] view to keep it longer or shorter). A Local
// step directly followed by Finish shares Finish's transaction: an
// operation of one Local step costs one transaction, as [Guard.Do] does,
// and every further Local step one more. If Finish then fails, that
// transaction rolls back and the run commits the step on its own before it
// runs Finish again, so a failure leaves the key where it would be had the
// step committed first.
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
	if i := ascii.IndexNotPrintable(s); i >= 0 {
		return fmt.Errorf("byte %d is %#02x, not printable ASCII", i, s[i])
	}
	return nil
}

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
