// Package observe describes what a Guard of package idempotency tells its
// Observer (idempotency.Config.Observer): one [Event] per finished call,
// with the [Outcome] that a metric counts by. Integrations (idemhttp,
// idemgrpc, the broker consumers) report their requests with the same
// outcomes.
package observe

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-idempotency/idempotency/backend"
)

// Outcome says how a guarded operation ended: a call of Guard.Do (see
// [Event]) or a request an integration such as idemhttp answered.
type Outcome int

// The outcomes an [Observer] is told about. Guard.Do reports Executed,
// Replayed, Mismatch, InProgress, StoreError (the store failed), Rejected
// (an invalid key or fingerprint), Internal (a schema or configuration
// error), Canceled (the caller's context ended) and HandlerError (fn
// failed); Operation.Run Unfinished too, Guard.Forget Forgotten, the
// Completer Exhausted, Guard.Purge Purged (one per batch), and
// Guard.AdmitQuota's callers OverQuota. Integrations report the same
// outcomes, plus NotStored.
const (
	// Executed: fn ran and its response was committed with the key.
	Executed Outcome = iota + 1
	// Replayed: a stored response was returned; fn did not run.
	Replayed
	// Mismatch: the key was used with another fingerprint.
	Mismatch
	// InProgress: the key was held by another caller past the wait bound.
	InProgress
	// NotStored: fn ran and gave an answer that is not stored (an HTTP
	// 400 or 409): sent, its writes rolled back, the key left free.
	NotStored
	// HandlerError: fn failed, panicked or gave no answer; its writes were
	// rolled back and the key left free.
	HandlerError
	// Rejected: the request was refused before the store was reached (a
	// missing or invalid key, an invalid body).
	Rejected
	// StoreError: the key store failed (ErrStore); fn did not run or
	// was rolled back.
	StoreError
	// Canceled: the caller went away before an answer; nothing was stored.
	Canceled
	// Internal: the integration is misconfigured, so the request was
	// refused without running fn.
	Internal
	// Unfinished: a run of an Operation stopped at a step after a
	// transient failure; the key resumes on a retry or in the Completer.
	Unfinished
	// Forgotten: an operator deleted the key (Guard.Forget); the next
	// call with it runs fn again, as for a new key.
	Forgotten
	// Exhausted: the Completer gave up on an unfinished operation after
	// its MaxTries failed runs. The key stays unfinished (never purged) for
	// an operator to inspect, finish by a retry, or forget.
	Exhausted
	// Purged: one batch of Guard.Purge ended; [Event].Deleted says how
	// many records it deleted, Duration how long it took, Err why it
	// failed (nil for a batch that succeeded).
	Purged
	// OverQuota: the request was refused by its scope's Quota before
	// anything was written.
	OverQuota
)

// String returns the outcome as a metrics label: "executed", "replayed",
// "mismatch", "in_progress", "not_stored", "handler_error",
// "rejected", "store_error", "canceled", "internal", "unfinished",
// "forgotten", "exhausted", "purged" or "over_quota".
func (o Outcome) String() string {
	switch o {
	case Executed:
		return "executed"
	case Replayed:
		return "replayed"
	case Mismatch:
		return "mismatch"
	case InProgress:
		return "in_progress"
	case NotStored:
		return "not_stored"
	case HandlerError:
		return "handler_error"
	case Rejected:
		return "rejected"
	case StoreError:
		return "store_error"
	case Canceled:
		return "canceled"
	case Internal:
		return "internal"
	case Unfinished:
		return "unfinished"
	case Forgotten:
		return "forgotten"
	case Exhausted:
		return "exhausted"
	case Purged:
		return "purged"
	case OverQuota:
		return "over_quota"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Event describes one finished call of Guard.Do, or of the other calls
// the [Outcome] constants name (one per batch of Guard.Purge).
//
// Log a call by [Event.KeyHash], not by Key's fields: the raw key is a
// client's secret-ish input (and often personal data), and log lines
// outlive it. Neither the key nor its hash may be a metric label: each
// call has its own, so a label would grow the metric without bound; label
// metrics by Outcome.
type Event struct {
	// Key is the call's key as the caller passed it. Printing it (%v, slog)
	// shows its hash only; see [Key.String].
	Key      backend.Key
	Outcome  Outcome
	Duration time.Duration
	// Attempts counts reservations tried, retries of [backend.ErrConflict] included.
	Attempts int
	// TTL is how long the Guard that handled the call keeps the answers
	// it completes (Config.TTL, or that of the Guard.WithTTL view it was
	// called on): a metric label for a route's retention. The key's own
	// expiry is the answer's Response.ExpiresAt.
	TTL time.Duration
	// Err is the error Do returned, nil for Executed and Replayed.
	Err error
	// Operation and Step name the Operation of a call of Operation.Run
	// or of the Completer, and the step it stopped at (its last step
	// when it finished); both are "" for a call of Guard.Do.
	Operation string
	Step      string

	// Waited is how long the call waited for another caller holding its
	// key: in memory behind the call of this Guard that was in the store,
	// and inside the store (each reservation given a wait, and each that
	// reported the key held, as SQLite's does after waiting for its one
	// write lock). A wait that ended in a replay has Outcome Replayed and
	// Waited > 0; one that ran out has Outcome InProgress. Zero for a
	// call that found the key free or completed.
	Waited time.Duration
	// RecordAge is, for a replay read from the store, how old the
	// replayed record is: the application's clock now minus the record's
	// CreatedAt (the store's clock when the key was reserved), zero if
	// the clocks make it negative. Zero for every other call, and for a
	// replay handed over in memory by the call that made the answer.
	RecordAge time.Duration
	// AfterFn: fn ran and returned an answer, and storing it failed (the
	// store's Complete returned the call's error: a cut connection, a
	// lost commit reply, a lease lost). The core cannot tell whether the
	// commit landed; a retry with the same key replays it or runs fn
	// once. Set only on a call that failed: Err wraps ErrStore, or the
	// context's error when ctx ended during the commit.
	AfterFn bool
	// Deleted is how many records a batch of Guard.Purge deleted
	// (Outcome Purged); zero for other events.
	Deleted int
}

// KeyHash returns [Key.Hash] of the call's key: the name of the key in
// logs and in the text of Do's errors. Not a metric label: see [Event].
func (e Event) KeyHash() string { return e.Key.Hash() }

// LogValue makes [log/slog] log an Event as a group of its key's hash
// (key_hash), outcome, duration, attempts and error, never the raw key.
func (e Event) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.String("key_hash", e.KeyHash()),
		slog.String("outcome", e.Outcome.String()),
		slog.Duration("duration", e.Duration),
		slog.Int("attempts", e.Attempts),
	}
	if e.Operation != "" {
		attrs = append(attrs, slog.String("operation", e.Operation), slog.String("step", e.Step))
	}
	if e.Waited > 0 {
		attrs = append(attrs, slog.Duration("waited", e.Waited))
	}
	if e.RecordAge > 0 {
		attrs = append(attrs, slog.Duration("record_age", e.RecordAge))
	}
	if e.AfterFn {
		attrs = append(attrs, slog.Bool("after_fn", true))
	}
	if e.Outcome == Purged {
		attrs = append(attrs, slog.Int("deleted", e.Deleted))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	return slog.GroupValue(attrs...)
}

// Observer is told about every call of Guard.Do once it ends, on the
// calling goroutine. It must not block for long.
type Observer func(ctx context.Context, ev Event)
