package idemhttp

import (
	"log/slog"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/observe"
)

// RequestEvent describes one guarded request once it is answered, for
// [Options].Observer: the request's side of the Guard's [observe.Event].
type RequestEvent struct {
	// Key is the request's key; its ID is empty when the request had no
	// valid key, its Scope empty until Scope ran. Log [RequestEvent.KeyHash]
	// rather than its fields, and never make either a metric label.
	Key idempotency.Key
	// Method and Route are the request's method and [Options].Route.
	Method, Route string
	// Outcome says how the request ended: Executed, Replayed, NotStored,
	// HandlerError, Mismatch, InProgress, Rejected, StoreError, Canceled,
	// OverQuota or Internal ([observe.Outcome]). Its String is the metric label.
	Outcome observe.Outcome
	// Status is the status sent to the client. For an answer of the
	// middleware's own, it is the one [Options].RenderProblem wrote, which
	// may differ from the problem's. It is 0 after a panic, or after a
	// handler that wrote around the middleware to a writer that does not
	// report its status.
	Status int
	// Duration is the time from the middleware's start to the answer.
	Duration time.Duration
	// Err is the cause of an error outcome: the store's error (wrapping
	// idempotency.ErrStore), the handler's failure, the reason of a
	// refusal (a refused key header wraps idempotency.ErrInvalidKey). Nil
	// for executed, replayed and not_stored, except when the handler also
	// wrote around the middleware: then it wraps [ErrWriterBypassed].
	Err error
	// Waited, RecordAge and AfterFn are those of the guard's call
	// ([observe.Event]): how long the request waited for another
	// holder of its key, how old the replayed record was, and whether
	// the handler ran and storing its answer failed. Zero when the
	// request did not reach the guard.
	Waited    time.Duration
	RecordAge time.Duration
	AfterFn   bool
	// QuotaLimit is the limit of [Options].Quota that refused the request
	// (Outcome OverQuota): "keys", "in_flight" or "bytes", a metric label;
	// "" otherwise.
	QuotaLimit string
}

// KeyHash returns the short hash of the request's key (scope and id,
// [idempotency.Key.Hash]) to name it in logs without showing it, or "" when
// the request had no valid key. The errors in Err name keys the same way.
// It is one value per key: not a metric label.
func (e RequestEvent) KeyHash() string {
	if e.Key.ID == "" {
		return ""
	}
	return e.Key.Hash()
}

// LogValue makes [log/slog] log a RequestEvent as [observe.Event] logs
// its own: a group of its key's hash (key_hash, [RequestEvent.KeyHash],
// "" without a valid key), method, route, outcome, status and duration,
// then waited, record_age, after_fn, quota_limit and error when set. It
// never logs the raw key (scope or id).
func (e RequestEvent) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.String("key_hash", e.KeyHash()),
		slog.String("method", e.Method),
		slog.String("route", e.Route),
		slog.String("outcome", e.Outcome.String()),
		slog.Int("status", e.Status),
		slog.Duration("duration", e.Duration),
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
	if e.QuotaLimit != "" {
		attrs = append(attrs, slog.String("quota_limit", e.QuotaLimit))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	return slog.GroupValue(attrs...)
}
