// Package otelmetrics feeds the events of the idemhttp middleware
// ([idemhttp.Options].Observer) and of a Guard ([idempotency.Config].Observer)
// to log/slog and to OpenTelemetry metrics, which any OpenTelemetry
// exporter sends on (the tests scrape them through the Prometheus one). It
// is its own module so that the OpenTelemetry SDK never enters the core
// module's requirements; the package itself needs only the OpenTelemetry
// API.
//
// The seven metrics an idempotency layer owes its operators, and where
// each is:
//
//  1. new keys: [RequestsMetric] with idempotency.outcome="executed";
//  2. replays: [RequestsMetric] with idempotency.outcome="replayed";
//  3. payload conflicts (a key reused with another request):
//     [RequestsMetric] with idempotency.outcome="mismatch";
//  4. in progress: refusals are [RequestsMetric] with
//     idempotency.outcome="in_progress"; every wait for another holder of
//     the key, whatever it ended in, is an observation of [WaitMetric];
//  5. age of the record at replay: [ReplayAgeMetric];
//  6. failures after commit (the handler ran, storing its answer failed):
//     [FailuresAfterFnMetric];
//  7. purge per batch: [PurgeDeletedMetric] (records deleted) and
//     [PurgeDurationMetric] (one observation per batch), from [Guard].
//
// No metric has the key, its scope or its hash as an attribute: each
// request has its own, so the metric would grow without bound.
package otelmetrics

import (
	"context"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/observe"
)

// Metric names.
const (
	// RequestsMetric counts guarded requests, with the attributes
	// idempotency.outcome (an [observe.Outcome] label), http.request.method and
	// http.response.status_code.
	RequestsMetric = "idempotency.http.requests"
	// DurationMetric is the time from the middleware's start to its
	// answer, in seconds, with the attribute idempotency.outcome.
	DurationMetric = "idempotency.http.duration"
	// WaitMetric is how long a request waited for another holder of its
	// key, in seconds, with the attribute idempotency.outcome (replayed:
	// the wait ended in the holder's answer; in_progress: it ran out).
	// Requests that did not wait are not observed.
	WaitMetric = "idempotency.http.wait"
	// ReplayAgeMetric is the age of a record replayed from the store, in
	// seconds ([idemhttp.RequestEvent].RecordAge). Replays handed over in memory
	// by the request that made the answer are not observed.
	ReplayAgeMetric = "idempotency.replay.age"
	// FailuresAfterFnMetric counts requests whose handler ran and whose
	// answer could not be stored ([idemhttp.RequestEvent].AfterFn): the commit
	// failed or its outcome is unknown. The client got a 503; its retry
	// replays or runs the handler once.
	FailuresAfterFnMetric = "idempotency.failures_after_fn"
	// PurgeDeletedMetric counts the records Guard.Purge deleted, and
	// PurgeDurationMetric is the duration of each of its batches, in
	// seconds, with the attribute idempotency.purge.failed.
	PurgeDeletedMetric  = "idempotency.purge.deleted"
	PurgeDurationMetric = "idempotency.purge.duration"
)

// New returns an observer for [idemhttp.Options].Observer that logs every
// event to logger (nil: no log) and records it on meter's instruments
// (nil: no metrics). Events whose outcome is an error of the server
// (handler_error, store_error, internal) are logged at Error level, the
// others at Debug, refusals (rejected, mismatch, in_progress) at Info.
// A log line names the request's key by its hash ([idemhttp.RequestEvent.KeyHash],
// attribute key_hash), never by the raw key or scope; the errors logged
// name it the same way.
func New(logger *slog.Logger, meter metric.Meter) (func(context.Context, idemhttp.RequestEvent), error) {
	var requests, afterFn metric.Int64Counter
	var duration, wait, age metric.Float64Histogram
	if meter != nil {
		var err error
		if requests, err = meter.Int64Counter(RequestsMetric, metric.WithUnit("{request}"),
			metric.WithDescription("Requests guarded by the idempotency middleware, by outcome.")); err != nil {
			return nil, fmt.Errorf("observe: %w", err)
		}
		if duration, err = meter.Float64Histogram(DurationMetric, metric.WithUnit("s"),
			metric.WithDescription("Time the idempotency middleware took to answer.")); err != nil {
			return nil, fmt.Errorf("observe: %w", err)
		}
		if wait, err = meter.Float64Histogram(WaitMetric, metric.WithUnit("s"),
			metric.WithDescription("Time a request waited for another holder of its key.")); err != nil {
			return nil, fmt.Errorf("observe: %w", err)
		}
		if age, err = meter.Float64Histogram(ReplayAgeMetric, metric.WithUnit("s"),
			metric.WithDescription("Age of the records replayed from the store.")); err != nil {
			return nil, fmt.Errorf("observe: %w", err)
		}
		if afterFn, err = meter.Int64Counter(FailuresAfterFnMetric, metric.WithUnit("{request}"),
			metric.WithDescription("Requests whose handler ran and whose answer could not be stored.")); err != nil {
			return nil, fmt.Errorf("observe: %w", err)
		}
	}
	return func(ctx context.Context, ev idemhttp.RequestEvent) {
		if meter != nil {
			outcome := attribute.String("idempotency.outcome", ev.Outcome.String())
			requests.Add(ctx, 1, metric.WithAttributes(outcome,
				attribute.String("http.request.method", ev.Method),
				attribute.Int("http.response.status_code", ev.Status)))
			duration.Record(ctx, ev.Duration.Seconds(), metric.WithAttributes(outcome))
			if ev.Waited > 0 {
				wait.Record(ctx, ev.Waited.Seconds(), metric.WithAttributes(outcome))
			}
			if ev.Outcome == observe.Replayed && ev.RecordAge > 0 {
				age.Record(ctx, ev.RecordAge.Seconds())
			}
			if ev.AfterFn {
				afterFn.Add(ctx, 1)
			}
		}
		if logger == nil {
			return
		}
		level := slog.LevelDebug
		switch ev.Outcome {
		case observe.HandlerError, observe.StoreError, observe.Internal:
			level = slog.LevelError
		case observe.Rejected, observe.Mismatch, observe.InProgress:
			level = slog.LevelInfo
		}
		attrs := []slog.Attr{
			slog.String("outcome", ev.Outcome.String()),
			slog.String("method", ev.Method),
			slog.String("route", ev.Route),
			slog.Int("status", ev.Status),
			slog.Duration("duration", ev.Duration),
		}
		// The key's hash, never the key: log lines outlive keys and reach
		// more readers than the store. Neither is a metric attribute (one
		// value per request).
		if h := ev.KeyHash(); h != "" {
			attrs = append(attrs, slog.String("key_hash", h))
		}
		if ev.Waited > 0 {
			attrs = append(attrs, slog.Duration("waited", ev.Waited))
		}
		if ev.RecordAge > 0 {
			attrs = append(attrs, slog.Duration("record_age", ev.RecordAge))
		}
		if ev.AfterFn {
			attrs = append(attrs, slog.Bool("after_fn", true))
		}
		if ev.Err != nil {
			attrs = append(attrs, slog.String("error", ev.Err.Error()))
		}
		logger.LogAttrs(ctx, level, "idempotency", attrs...)
	}, nil
}

// Guard returns an observer for [idempotency.Config].Observer of the
// Guard behind the middleware: it records each batch of Guard.Purge
// (Outcome purged) on [PurgeDeletedMetric] and [PurgeDurationMetric], and
// logs a failed batch at Error level. The guard's other events are the
// middleware's requests, which [New] records: it ignores them.
func Guard(logger *slog.Logger, meter metric.Meter) (observe.Observer, error) {
	var deleted metric.Int64Counter
	var took metric.Float64Histogram
	if meter != nil {
		var err error
		if deleted, err = meter.Int64Counter(PurgeDeletedMetric, metric.WithUnit("{record}"),
			metric.WithDescription("Expired records deleted by Guard.Purge.")); err != nil {
			return nil, fmt.Errorf("observe: %w", err)
		}
		if took, err = meter.Float64Histogram(PurgeDurationMetric, metric.WithUnit("s"),
			metric.WithDescription("Duration of each batch of Guard.Purge.")); err != nil {
			return nil, fmt.Errorf("observe: %w", err)
		}
	}
	return func(ctx context.Context, ev observe.Event) {
		if ev.Outcome != observe.Purged {
			return
		}
		if meter != nil {
			deleted.Add(ctx, int64(ev.Deleted))
			took.Record(ctx, ev.Duration.Seconds(), metric.WithAttributes(attribute.Bool("idempotency.purge.failed", ev.Err != nil)))
		}
		if logger != nil && ev.Err != nil {
			logger.LogAttrs(ctx, slog.LevelError, "idempotency purge batch failed",
				slog.Int("deleted", ev.Deleted), slog.Duration("duration", ev.Duration), slog.String("error", ev.Err.Error()))
		}
	}, nil
}
