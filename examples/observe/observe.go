// Package observe feeds the events of the idemhttp middleware
// ([idemhttp.Config].Observer) to log/slog and to OpenTelemetry metrics: a
// counter of requests by outcome and a histogram of their duration. It is
// its own module so that the OpenTelemetry SDK never enters the core
// module's requirements; the package itself needs only the OpenTelemetry
// API.
package observe

import (
	"context"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
)

// Metric names.
const (
	// RequestsMetric counts guarded requests, with the attributes
	// idempotency.outcome (an [idempotency.Outcome] label), http.request.method and
	// http.response.status_code.
	RequestsMetric = "idempotency.http.requests"
	// DurationMetric is the time from the middleware's start to its
	// answer, in seconds, with the attribute idempotency.outcome.
	DurationMetric = "idempotency.http.duration"
)

// New returns an observer for [idemhttp.Config].Observer that logs every
// event to logger (nil: no log) and records it on meter's instruments
// (nil: no metrics). Events whose outcome is an error of the server
// (handler_error, store_error, internal) are logged at Error level, the
// others at Debug, refusals (rejected, mismatch, in_progress) at Info.
// A log line names the request's key by its hash ([idemhttp.Event.KeyHash],
// attribute key_hash), never by the raw key or scope; the errors logged
// name it the same way.
func New(logger *slog.Logger, meter metric.Meter) (func(context.Context, idemhttp.Event), error) {
	var requests metric.Int64Counter
	var duration metric.Float64Histogram
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
	}
	return func(ctx context.Context, ev idemhttp.Event) {
		if meter != nil {
			outcome := attribute.String("idempotency.outcome", ev.Outcome.String())
			requests.Add(ctx, 1, metric.WithAttributes(outcome,
				attribute.String("http.request.method", ev.Method),
				attribute.Int("http.response.status_code", ev.Status)))
			duration.Record(ctx, ev.Duration.Seconds(), metric.WithAttributes(outcome))
		}
		if logger == nil {
			return
		}
		level := slog.LevelDebug
		switch ev.Outcome {
		case idempotency.HandlerError, idempotency.StoreError, idempotency.Internal:
			level = slog.LevelError
		case idempotency.Rejected, idempotency.Mismatch, idempotency.InProgress:
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
		if ev.Err != nil {
			attrs = append(attrs, slog.String("error", ev.Err.Error()))
		}
		logger.LogAttrs(ctx, level, "idempotency", attrs...)
	}, nil
}
