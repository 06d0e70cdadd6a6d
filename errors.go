package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/ascii"
	"github.com/go-idempotency/idempotency/internal/canonical"
	"github.com/go-idempotency/idempotency/observe"
)

// Errors returned by [Guard.Do]; match them with errors.Is.
var (
	// ErrInvalidFingerprint: the fingerprint is empty, too long or not
	// printable ASCII. The store was not touched.
	ErrInvalidFingerprint = errors.New("idempotency: invalid fingerprint")
	// ErrInvalidResponse: fn returned a Response that cannot be stored
	// (status outside 100..599, or a nil fn). The transaction was rolled
	// back and the key left free.
	ErrInvalidResponse = errors.New("idempotency: invalid response")
	// ErrMismatch: the key was completed by a request with another
	// fingerprint. fn was not called. (HTTP 422.)
	ErrMismatch = errors.New("idempotency: key reused with a different request")
	// ErrInvalidBody: [FingerprintJSON] or [FingerprintForm] was given
	// bytes that are not one valid JSON value, or not an
	// application/x-www-form-urlencoded body as net/url parses it.
	// (HTTP 400.)
	ErrInvalidBody = canonical.ErrInvalid
	// ErrStore: the store failed (a cut connection, a timeout, a busy
	// database, conflicts still failing after every retry, a lost commit
	// reply). The driver's error stays in the chain. Whatever the store did,
	// the guarantee holds: the effect and the key were committed together
	// or not at all. So retrying the same request with the same key is
	// safe: it replays the committed answer or runs fn once. (HTTP 503.)
	ErrStore = errors.New("idempotency: store failed; retrying with the same key is safe")
	// ErrTooLarge: an [Operation]'s input and step data ([State]) would
	// take more than [backend.MaxProgressLen] bytes. Checked before anything is
	// written for the input; a step that sets too much fails, rolled back.
	ErrTooLarge = errors.New("idempotency: operation input and step data too large")
	// ErrUnfinished: a run of an [Operation] failed between two steps with
	// an error that is not [FinalAnswer]. Every step before it is committed; the
	// key is unfinished, and a retry with the same key (or the
	// [Completer]) resumes it at the step that failed. (HTTP 503.)
	ErrUnfinished = errors.New("idempotency: operation unfinished; retrying with the same key resumes it")
)

// storeError adds [ErrStore] to the chain of an error that came from the
// store rather than from fn, the caller's input or the caller's context.
// own reports that the error returned is fn's own, as fn returned it.
func storeError(ctx context.Context, err error) (_ error, own bool) {
	var fe fnError
	switch {
	case errors.Is(err, ErrStore):
		return err, false
	case errors.Is(err, backend.ErrConflict): // retries exhausted
		return fmt.Errorf("%w: %w", ErrStore, err), false
	case errors.As(err, &fe):
		return fe.err, true
	case errors.Is(err, ErrMismatch), errors.Is(err, ErrInProgress),
		errors.Is(err, ErrInvalidResponse), errors.Is(err, ErrInvalidConfig),
		errors.Is(err, ErrCodec), errors.Is(err, ErrSchema): // ErrSchema: a retry does not help
		return err, false
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return err, false
	}
	return fmt.Errorf("%w: %w", ErrStore, err), false
}

// fnError marks an error that fn returned, so that it reaches the caller
// as it is (plus a failed rollback, if any), never as a store failure.
// fn is fn's own error; err is what the caller gets.
type fnError struct{ fn, err error }

func (e fnError) Error() string { return e.err.Error() }

func (e fnError) Unwrap() error { return e.err }

// outcomeOf is the Outcome of a call that returned resp and err: the one
// its error names, HandlerError for an error of fn's own.
func outcomeOf(resp Response, err error) observe.Outcome {
	switch {
	case err == nil && resp.Replayed:
		return observe.Replayed
	case err == nil:
		return observe.Executed
	case errors.Is(err, ErrMismatch):
		return observe.Mismatch
	case errors.Is(err, ErrInProgress):
		return observe.InProgress
	case errors.Is(err, ErrStore), errors.Is(err, ErrCodec):
		return observe.StoreError
	case errors.Is(err, ErrOverQuota):
		return observe.OverQuota
	case errors.Is(err, ErrInvalidKey), errors.Is(err, ErrInvalidFingerprint), errors.Is(err, ErrInvalidInput):
		return observe.Rejected
	case errors.Is(err, ErrSchema), errors.Is(err, ErrInvalidConfig), errors.Is(err, errors.ErrUnsupported):
		return observe.Internal
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return observe.Canceled
	}
	return observe.HandlerError
}

// Errors a store reports, shared with package backend (the same values,
// so errors.Is matches either name).
var (
	// ErrInvalidKey: the key's id or scope is outside its allowed space. The
	// store was not touched. (HTTP 400.)
	ErrInvalidKey = backend.ErrInvalidKey
	// ErrInvalidConfig: a [Config] field is out of range. Returned by [New].
	ErrInvalidConfig = backend.ErrInvalidConfig
	// ErrInProgress: another caller holds the key and the wait bound
	// ([Config.WaitTimeout]) ran out before it finished, at once when it is
	// negative. fn was not called. (HTTP 409.)
	ErrInProgress = backend.ErrInProgress
	// ErrNotFound: the store holds no record for the key ([Guard.Inspect],
	// [Guard.Forget]).
	ErrNotFound = backend.ErrNotFound
)

// ErrSchema: the store's table is missing, or lacks a column this version
// needs: it was never migrated, [Config]'s table name has a typo, the
// table is that of an older version, or the service connects to another
// database or schema than the one migrated. Stores wrap the database's
// "no such table" and "no such column" errors of their own statements with
// it; the message names the table (or the column) and says to run the
// store's Migrate or apply its Schema. [Guard.CheckSchema] returns it
// before a service serves.
//
// It is a configuration error, not a transient failure: retrying does not
// help until the schema is fixed, so it is never wrapped in [ErrStore]
// (whose message says a retry is safe). Nothing was written: the key is
// not taken, fn did not run, and after the migration the same key runs as
// a new one. [observe.Event].Outcome is [observe.Failed]; idemhttp answers it with 500,
// not 503 with Retry-After.
var ErrSchema = backend.ErrSchema

func validateFingerprint(fp string) error {
	switch {
	case len(fp) == 0:
		return fmt.Errorf("%w: empty", ErrInvalidFingerprint)
	case len(fp) > backend.MaxFingerprintLen:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidFingerprint, len(fp), backend.MaxFingerprintLen)
	}
	if i := ascii.IndexNotPrintable(fp); i >= 0 {
		return fmt.Errorf("%w: byte %d is %#02x, not printable ASCII", ErrInvalidFingerprint, i, fp[i])
	}
	return nil
}
