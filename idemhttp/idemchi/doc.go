// Package idemchi has no API: chi is net/http, and [idemhttp.Middleware]
// mounts on it as it is, with r.Use on a router or group, or r.With on
// one route. This module holds the tests (over real HTTP, on SQLite and
// PostgreSQL) and the example that show it, so that chi never enters the
// requirements of the core module.
//
//	cfg := &idemhttp.Config{Scope: accountScope} // required: the authenticated account
//	r := chi.NewRouter()
//	r.Use(middleware.Recoverer)
//	r.With(idemhttp.Middleware(guard, cfg)).Post("/payments", createPayment)
//
// cfg.Scope is required, as everywhere: mounted without it the middleware
// answers every guarded request 500 ([idemhttp.ErrNoScope]) rather than
// share one key space between clients.
//
// The default fingerprint route, r.URL.RequestURI(), is the right one on
// chi too; a route pattern ("/orders/{id}/capture") would make two orders
// one request.
package idemchi

import _ "github.com/go-idempotency/idempotency/idemhttp" // for the doc links
