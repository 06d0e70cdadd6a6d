// Package idemgin mounts the idemhttp middleware on gin.
//
// The usual way to mount a net/http middleware on gin is wrong for
// idemhttp. That way is a gin.HandlerFunc that sets c.Request and calls
// c.Next() from inside the middleware's handler. But gin's handlers write
// to c.Writer, which is not the buffering writer the middleware gave its
// handler. So the answer (201 "approved") reaches the client, while the
// middleware, seeing none, rolls the handler's writes back.
//
// idemhttp cannot intercept c.Writer. It notices afterwards
// ([idemhttp.ErrWriterBypassed], reported once to
// [idemhttp.Options].OnError). From then on that middleware answers every
// guarded request 500 without running the handler in a transaction
// ([idemhttp.ErrBypassRefused]). An adapter that does not c.Abort() when
// the middleware answered lets gin run the handler anyway, after it and
// outside any transaction: [TxFrom] reports false there.
//
// [Middleware] replaces c.Writer for the rest of the chain. So gin's
// handlers, and the middleware after this one, write into the middleware's
// buffer:
//
//	cfg := &idemhttp.Options{Scope: accountScope} // required: the authenticated account
//	r := gin.New()
//	r.Use(gin.Recovery())
//	r.POST("/payments", idemgin.Middleware(guard, cfg), createPayment)
//
//	func createPayment(c *gin.Context) {
//		tx, ok := idemgin.TxFrom[*sql.Tx](c)
//		if !ok { // not guarded: the middleware is not mounted on this route
//			...
//		}
//		...
//		c.JSON(http.StatusCreated, payment)
//	}
//
// Pass c.Request.Context(), never c itself, to the transaction's
// methods: gin recycles its Context once the request ends, while
// database/sql may still watch the context it was given.
//
// A handler that writes nothing (not even c.Status) is rolled back and
// answered 500 ProblemNoResponse. So is one that only records
// errors with c.Error. c.AbortWithStatusJSON(502, ...) is sent to the
// client and rolled back. A panic is rolled back and re-raised for
// gin.Recovery to answer.
package idemgin

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
)

// Middleware returns a gin handler that guards the rest of the chain as
// [idemhttp.Middleware] does with g and cfg; the chain writes into the
// middleware's buffer through c.Writer. Mount it on the routes (or groups)
// it guards, after gin.Recovery. cfg.Scope is required ([idemhttp.ErrNoScope]).
func Middleware[Tx any](g *idempotency.Guard[Tx], cfg *idemhttp.Options) gin.HandlerFunc {
	mw := idemhttp.Middleware(g, cfg)
	return func(c *gin.Context) {
		outer := c.Writer
		ran := false
		h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			c.Request = r
			if w != http.ResponseWriter(outer) { // the middleware's buffer: the chain writes there
				gw := &writer{ResponseWriter: w, status: http.StatusOK}
				c.Writer = gw
				defer func() { c.Writer = outer }()
				c.Next()
				if gw.pending {
					gw.WriteHeaderNow() // c.Status(code) with no body, as gin would send it
				}
				return
			}
			c.Next() // unguarded method, or no key with KeyOptional
		}))
		h.ServeHTTP(outer, c.Request)
		if !ran {
			c.Abort() // answered by the middleware: replay, refusal, error
		}
	}
}

// TxFrom returns the transaction the middleware opened for c's request;
// see [idempotency.TxFrom]: check ok, and call it with the Guard's Tx (another
// type panics with an error naming both).
func TxFrom[Tx any](c *gin.Context) (Tx, bool) {
	return idempotency.TxFrom[Tx](c.Request.Context())
}

// KeyFrom returns the key of c's request; see [idempotency.KeyFrom].
func KeyFrom(c *gin.Context) (idempotency.Key, bool) {
	return idempotency.KeyFrom(c.Request.Context())
}

// writer is a gin.ResponseWriter over the middleware's buffer, with gin's
// semantics: WriteHeader only records the status (the last one wins) until
// WriteHeaderNow or the first Write sends it. Unlike gin's own writer, it
// sends nothing when the handler set no status and wrote nothing, so that
// the middleware sees "no answer".
type writer struct {
	http.ResponseWriter
	status  int
	pending bool // WriteHeader was called and not yet sent
	size    int
	written bool
}

var _ gin.ResponseWriter = (*writer)(nil)

func (w *writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *writer) WriteHeader(code int) {
	if code > 0 && !w.written {
		w.status, w.pending = code, true
	}
}

func (w *writer) WriteHeaderNow() {
	if !w.written {
		w.written, w.pending = true, false
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *writer) Write(data []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(data)
	w.size += n
	return n, err
}

func (w *writer) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	n, err := io.WriteString(w.ResponseWriter, s)
	w.size += n
	return n, err
}

func (w *writer) Status() int { return w.status }

func (w *writer) Size() int {
	if !w.written {
		return -1
	}
	return w.size
}

func (w *writer) Written() bool { return w.written }

// errNotSupported is returned by Hijack: a buffered response cannot be
// taken over.
var errNotSupported = errors.New("idemgin: Hijack is not supported behind the idempotency middleware")

func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, errNotSupported }

// Flush sends the status if it is pending; the buffered body stays
// buffered until the handler returns.
func (w *writer) Flush() { w.WriteHeaderNow() }

// CloseNotify never fires; use the request's context. It is here because
// gin.ResponseWriter includes http.CloseNotifier.
func (w *writer) CloseNotify() <-chan bool { return make(chan bool) }

func (w *writer) Pusher() http.Pusher { return nil }
