// Package idemecho mounts the idemhttp middleware on echo (v4).
//
// echo.WrapMiddleware is wrong for idemhttp. A handler may return an error,
// such as echo.NewHTTPError(502) or the 400 of a failed c.Bind. echo's
// HTTPErrorHandler writes it after the middleware has finished. So the
// middleware saw no answer, and used to store an empty 200 with the
// handler's writes committed.
//
// [Middleware] renders a returned error with the echo instance's
// HTTPErrorHandler inside the middleware. So the error's own status is what
// the policy judges (a 502 or a 400 is rolled back and not stored), and
// what the client gets:
//
//	cfg := &idemhttp.Options{Scope: accountScope} // required: the authenticated account
//	e := echo.New()
//	e.Use(middleware.Recover())
//	e.POST("/payments", createPayment, idemecho.Middleware(guard, cfg))
//
//	func createPayment(c echo.Context) error {
//		tx, ok := idemecho.TxFrom[*sql.Tx](c)
//		if !ok { // not guarded: the middleware is not mounted on this route
//			...
//		}
//		...
//		return c.JSON(http.StatusCreated, payment)
//	}
//
// A handler that writes nothing and returns nil is rolled back and
// answered 500 ProblemNoResponse. A panic is rolled back and
// re-raised for echo's Recover middleware to answer.
package idemecho

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
)

// Middleware returns an echo middleware that guards the handler as
// [idemhttp.Middleware] does with g and cfg. An error the handler returns
// is rendered by echo's HTTPErrorHandler first, and that answer is what is
// judged, stored and replayed. cfg.Scope is required ([idemhttp.ErrNoScope]).
func Middleware[Tx any](g *idempotency.Guard[Tx], cfg *idemhttp.Options) echo.MiddlewareFunc {
	mw := idemhttp.Middleware(g, cfg)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			outer := c.Response()
			var unguarded error
			h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c.SetRequest(r)
				if w == http.ResponseWriter(outer) { // unguarded method, or no key with KeyOptional
					unguarded = next(c)
					return
				}
				c.SetResponse(echo.NewResponse(w, c.Echo()))
				defer c.SetResponse(outer)
				if err := next(c); err != nil {
					// Rendered into the middleware's buffer, where the
					// store policy sees its status.
					c.Error(err)
				}
			}))
			h.ServeHTTP(outer, c.Request())
			return unguarded
		}
	}
}

// TxFrom returns the transaction the middleware opened for c's request;
// see [idempotency.TxFrom]: check ok, and call it with the Guard's Tx (another
// type panics with an error naming both).
func TxFrom[Tx any](c echo.Context) (Tx, bool) {
	return idempotency.TxFrom[Tx](c.Request().Context())
}

// KeyFrom returns the key of c's request; see [idempotency.KeyFrom].
func KeyFrom(c echo.Context) (idempotency.Key, bool) {
	return idempotency.KeyFrom(c.Request().Context())
}
