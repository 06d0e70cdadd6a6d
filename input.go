package idempotency

import (
	"context"
	"errors"
	"fmt"
)

// ErrInvalidInput: an [Operation]'s Validate refused the input of [Guard.Run]
// before anything was stored. The key stays free: the corrected request,
// with the same key, runs. Over HTTP it is a 400 whose detail is the
// Validate error's text (idemhttp).
var ErrInvalidInput = errors.New("idempotency: invalid input")

// inputError is the error [Guard.Run] returns when the operation's
// Validate refused its input: errors.Is(err, [ErrInvalidInput]) holds, and
// Unwrap gives the Validate error, so that errors.As finds a type of the
// caller's (idemhttp's *Problem, say).
type inputError struct {
	// Operation is the operation's name.
	Operation string
	// Err is what Validate returned.
	Err error
}

func (e *inputError) Error() string {
	return fmt.Sprintf("idempotency: operation %q: invalid input: %v", e.Operation, e.Err)
}

// Is reports ErrInvalidInput.
func (e *inputError) Is(target error) bool { return target == ErrInvalidInput }

// Unwrap returns the Validate error.
func (e *inputError) Unwrap() error { return e.Err }

// checkInput runs op's Validate, if it has one, on input: the check of
// [Guard.Run] before the key is taken. A nil op is left to its validation.
func (op *Operation[Tx]) checkInput(ctx context.Context, input []byte) error {
	if op == nil || op.Validate == nil {
		return nil
	}
	if err := op.Validate(ctx, input); err != nil {
		return &inputError{Operation: op.Name, Err: err}
	}
	return nil
}
