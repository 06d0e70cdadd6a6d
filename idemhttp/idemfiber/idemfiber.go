// Package idemfiber mounts the idemhttp middleware on fiber v2, natively on
// fasthttp.
//
// fiber's adaptor.HTTPMiddleware is wrong for idemhttp. It calls c.Next()
// after the net/http middleware has returned. So the transaction commits
// (and an empty answer used to be stored) before the handler runs.
//
// [Middleware] is a fiber handler that runs the rest of the chain inside
// the guard's transaction. It renders a returned error with the app's
// ErrorHandler there. Then it hands the fiber response (status, headers,
// body) to the middleware, which stores it with the key or rolls it back:
//
//	cfg := &idemhttp.Options{Scope: accountScope} // required: the authenticated account
//	app := fiber.New()
//	app.Use(recover.New())
//	app.Post("/payments", idemfiber.Middleware(guard, cfg), createPayment)
//
//	func createPayment(c *fiber.Ctx) error {
//		tx, ok := idemfiber.TxFrom[*sql.Tx](c)
//		if !ok { // not guarded: the middleware is not mounted on this route
//			...
//		}
//		...
//		return c.Status(fiber.StatusCreated).JSON(payment)
//	}
//
// The transaction is in c.UserContext(). A handler that sets no status and
// writes no body is rolled back and answered 500
// ProblemNoResponse. A panic is rolled back and re-raised for
// fiber's recover middleware to answer. Streamed bodies (SendStream) are
// read whole into the buffer.
package idemfiber

import (
	"bytes"
	"fmt"
	"net/http"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
)

// unset is the status the response holds while the chain runs: still
// there afterwards, it means the handler set none.
const unset = 1

// Middleware returns a fiber handler that guards the rest of the chain as
// [idemhttp.Middleware] does with g and cfg, on the net/http request fiber
// converts from its own. cfg.Scope is required ([idemhttp.ErrNoScope]).
func Middleware[Tx any](g *idempotency.Guard[Tx], cfg *idemhttp.Options) fiber.Handler {
	mw := idemhttp.Middleware(g, cfg)
	return func(c *fiber.Ctx) error {
		req, err := request(c)
		if err != nil {
			return fiber.NewError(fiber.StatusBadRequest, err.Error())
		}
		out := &writer{c: c, header: http.Header{}}
		var unguarded error
		h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c.SetUserContext(r.Context())
			if w == http.ResponseWriter(out) { // unguarded method, or no key with KeyOptional
				unguarded = c.Next()
				return
			}
			runChain(c, w)
		}))
		h.ServeHTTP(out, req)
		return unguarded
	}
}

// runChain runs the rest of the chain on a clean response and copies what
// it answered into w, the middleware's buffer. The response is restored to
// what it held before (headers set by outer handlers), even on a panic.
func runChain(c *fiber.Ctx, w http.ResponseWriter) {
	resp := c.Response()
	var saved fasthttp.ResponseHeader
	resp.Header.CopyTo(&saved)
	restore := func() {
		resp.ResetBody()
		saved.CopyTo(&resp.Header)
	}
	defer restore()
	resp.Header.Reset()
	resp.ResetBody()
	resp.SetStatusCode(unset)
	if err := c.Next(); err != nil {
		if herr := c.App().ErrorHandler(c, err); herr != nil {
			resp.ResetBody()
			resp.SetStatusCode(fiber.StatusInternalServerError)
		}
	}
	status, body := resp.StatusCode(), resp.Body()
	if status == unset && len(body) == 0 {
		return // nothing written: the middleware rolls back and answers 500
	}
	if status == unset {
		status = fiber.StatusOK
	}
	hdr := w.Header()
	resp.Header.VisitAll(func(k, v []byte) {
		switch key := http.CanonicalHeaderKey(string(k)); key {
		case "Content-Length", "Transfer-Encoding", "Connection", "Server", "Date":
		default:
			hdr.Add(key, string(v))
		}
	})
	w.WriteHeader(status)
	if len(body) > 0 {
		_, _ = w.Write(bytes.Clone(body))
	}
}

// request converts the fiber request to the *http.Request the middleware
// reads: method, URI, headers, body and remote address; its context is
// c.UserContext().
func request(c *fiber.Ctx) (*http.Request, error) {
	fr := c.Request()
	body := bytes.Clone(fr.Body())
	r, err := http.NewRequestWithContext(c.UserContext(), c.Method(), string(fr.RequestURI()), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("idemfiber: %w", err)
	}
	fr.Header.VisitAll(func(k, v []byte) {
		r.Header.Add(string(k), string(v))
	})
	r.Host = string(fr.Host())
	r.RemoteAddr = c.Context().RemoteAddr().String()
	if len(body) == 0 {
		r.Body = http.NoBody
	}
	return r, nil
}

// writer writes the middleware's final answer into the fiber response.
type writer struct {
	c       *fiber.Ctx
	header  http.Header
	written bool
}

func (w *writer) Header() http.Header { return w.header }

func (w *writer) WriteHeader(code int) {
	if w.written {
		return
	}
	w.written = true
	resp := w.c.Response()
	for k, vs := range w.header {
		switch k {
		case "Content-Length":
			continue // fasthttp computes it from the body
		}
		for i, v := range vs {
			if i == 0 {
				resp.Header.Set(k, v)
			} else {
				resp.Header.Add(k, v)
			}
		}
	}
	resp.SetStatusCode(code)
	resp.ResetBody()
}

func (w *writer) Write(p []byte) (int, error) {
	if !w.written {
		w.WriteHeader(http.StatusOK)
	}
	w.c.Response().AppendBody(p)
	return len(p), nil
}

// TxFrom returns the transaction the middleware opened for c's request
// (in c.UserContext()); see [idempotency.TxFrom]: check ok, and call it with
// the Guard's Tx (another type panics with an error).
func TxFrom[Tx any](c *fiber.Ctx) (Tx, bool) {
	return idempotency.TxFrom[Tx](c.UserContext())
}

// KeyFrom returns the key of c's request; see [idempotency.KeyFrom].
func KeyFrom(c *fiber.Ctx) (idempotency.Key, bool) {
	return idempotency.KeyFrom(c.UserContext())
}
