package idemhttp

import (
	"time"

	"github.com/go-idempotency/idempotency"
)

// Outcome is how a guarded request ended, as told to [Config].Observer.
// Its values are short labels, fit for a metric attribute.
type Outcome string

// The outcomes of a guarded request.
const (
	// OutcomeExecuted: the handler ran and its response was stored with
	// the key, committed with its writes.
	OutcomeExecuted Outcome = "executed"
	// OutcomeReplayed: a stored response was sent; the handler did not run.
	OutcomeReplayed Outcome = "replayed"
	// OutcomeNotStored: the handler ran and answered a status below 500
	// that [Config].Store refuses (a 400, a 409...): sent, rolled back,
	// the key left free.
	OutcomeNotStored Outcome = "not_stored"
	// OutcomeHandlerError: the handler answered 5xx, panicked, wrote no
	// response at all, or wrote a response over [Config].MaxResponseBody;
	// its writes were rolled back and the key left free.
	OutcomeHandlerError Outcome = "handler_error"
	// OutcomeMismatch: the key was used with another request (422).
	OutcomeMismatch Outcome = "mismatch"
	// OutcomeInProgress: the key is held by a running request (409).
	OutcomeInProgress Outcome = "in_progress"
	// OutcomeRejected: refused before the store was reached: missing or
	// invalid key, invalid or too large body, a Scope problem (4xx).
	OutcomeRejected Outcome = "rejected"
	// OutcomeStoreError: the key store failed (503); the handler did not
	// run or was rolled back.
	OutcomeStoreError Outcome = "store_error"
	// OutcomeCanceled: the client went away (its context was cancelled)
	// before an answer; nothing was stored.
	OutcomeCanceled Outcome = "canceled"
	// OutcomeInternal: the middleware is misconfigured (500): no Scope
	// ([ErrNoScope]), nil guard, failing Scope, invalid scope or status;
	// a handler that wrote around the middleware ([ErrWriterBypassed]:
	// rolled back, and Status is the handler's own when its answer had
	// already gone out) and every request refused after it
	// ([ErrBypassRefused]).
	OutcomeInternal Outcome = "internal"
)

// Event describes one guarded request, once answered; see
// [Config].Observer.
type Event struct {
	// Key is the request's key; its ID is empty when the request had no
	// valid key, its Scope empty until Scope ran. Log [Event.KeyHash]
	// rather than its fields, and never make either a metric label.
	Key idempotency.Key
	// Method and Route are the request's method and [Config].Route.
	Method, Route string
	// Outcome says how the request ended.
	Outcome Outcome
	// Status is the status sent to the client: for an answer of the
	// middleware's own, the one [Config].RenderProblem wrote, which may
	// differ from the problem's (0 after a panic, or after a handler that
	// wrote around the middleware to a writer that does not report its
	// status).
	Status int
	// Duration is the time from the middleware's start to the answer.
	Duration time.Duration
	// Err is the cause of an error outcome: the store's error (wrapping
	// idempotency.ErrStore), the handler's failure, the reason of a
	// refusal (a refused key header wraps idempotency.ErrInvalidKey). Nil
	// for executed, replayed and not_stored, except when the handler also
	// wrote around the middleware: then it wraps [ErrWriterBypassed].
	Err error
}

// KeyHash returns the short hash of the request's key (scope and id,
// [idempotency.Key.Hash]) to name it in logs without showing it, or "" when
// the request had no valid key. The errors in Err name keys the same way.
// It is one value per key: not a metric label.
func (e Event) KeyHash() string {
	if e.Key.ID == "" {
		return ""
	}
	return e.Key.Hash()
}
