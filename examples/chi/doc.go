// Package chiexample shows [idemhttp.Middleware] on chi. chi is net/http,
// so the middleware mounts on it as it is: r.Use on a router or group, or
// r.With on one route. Its tests run the framework suite through chi's
// router and Recoverer; it is a module of its own so that chi never enters
// the core module's requirements.
//
//	cfg := &idemhttp.Options{Scope: accountScope} // required: the authenticated account
//	r := chi.NewRouter()
//	r.Use(middleware.Recoverer)
//	r.With(idemhttp.Middleware(guard, cfg)).Post("/payments", createPayment)
//
// The default fingerprint route, r.URL.RequestURI(), is the right one on
// chi too; a route pattern ("/orders/{id}/capture") would make two orders
// one request.
package chiexample

import _ "github.com/go-idempotency/idempotency/idemhttp" // for the doc links
