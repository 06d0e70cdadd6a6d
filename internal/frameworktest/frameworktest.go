// Package frameworktest is the test suite every framework integration of
// idemhttp runs (net/http, ServeMux, chi, gin, echo, fiber). It runs over
// real HTTP, against a real store: SQLite, and PostgreSQL from
// IDEMPOTENCY_POSTGRES_DSN. It checks that a handler that writes is stored
// and replayed byte-exact with one effect in the database. It checks that a
// handler that returns a framework error, panics, writes nothing or fails
// request validation leaves no effect and no stored key.
package frameworktest

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
)

// Routes the framework under test serves, all POST, each behind the
// framework's integration of the middleware, each written in the
// framework's own idiom.
const (
	// RouteWrite: call Handlers.Effect, then answer 201 with
	// Handlers.Body(n) as application/json and Location: /things/<n>.
	RouteWrite = "/write"
	// RouteError: call Handlers.Effect, then fail the framework's way
	// (gin: c.AbortWithStatusJSON or c.Error; echo: return
	// echo.NewHTTPError(502); fiber: return fiber.NewError(502)) with a
	// 502 Bad Gateway.
	RouteError = "/error"
	// RoutePanic: call Handlers.Effect, then panic. The framework's own
	// recovery middleware (outside the integration) answers.
	RoutePanic = "/panic"
	// RouteNothing: call Handlers.Effect, then return without writing
	// anything.
	RouteNothing = "/nothing"
	// RouteBind: bind the JSON body {"amount": <int>} with the framework's
	// binder (which refuses {"amount":"x"}) and answer its 400, after
	// calling Handlers.Effect.
	RouteBind = "/bind"
)

// Handlers is what the framework's handlers use.
type Handlers struct {
	// Effect inserts one row for the request's key through the
	// transaction that ctx carries (the request's context, where the
	// integration put it). It fails when ctx carries none.
	Effect func(ctx context.Context) error
	// Run counts a handler run and returns its number, from 1.
	Run func() int64
}

// Body is the 201 body of RouteWrite on run n: unique per run, so a
// second run cannot pass for a replay.
func Body(n int64) map[string]any {
	return map[string]any{"run": n, "at": time.Now().Format(time.RFC3339Nano)}
}

// Mount starts the framework's server on one store and returns its base
// URL; it stops it with t.Cleanup. Each method is the same generic code of
// the framework's test, instantiated with the store's transaction type.
type Mount interface {
	SQLite(t *testing.T, g *idempotency.Guard[*sql.Tx], opts *idemhttp.Options, h Handlers) string
	Postgres(t *testing.T, g *idempotency.Guard[pgx.Tx], opts *idemhttp.Options, h Handlers) string
}

// Run runs the suite on SQLite and PostgreSQL.
func Run(t *testing.T, m Mount) {
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		e := SQLite(t)
		runCases(t, e, func(t *testing.T, opts *idemhttp.Options) string {
			return m.SQLite(t, e.Guard(t, nil), opts, e.Handlers)
		})
	})
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		e := Postgres(t)
		runCases(t, e, func(t *testing.T, opts *idemhttp.Options) string {
			return m.Postgres(t, e.Guard(t, nil), opts, e.Handlers)
		})
	})
}
