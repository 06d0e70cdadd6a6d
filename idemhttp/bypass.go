package idemhttp

import (
	"errors"
	"fmt"
	"log"
	"net/http"
	"slices"
	"sync/atomic"

	"github.com/go-idempotency/idempotency/observe"
)

// ErrBypassRefused: the request was refused with 500 ProblemInternal
// before the handler ran, because an earlier request through the same
// [Middleware] wrote its answer around the middleware ([ErrWriterBypassed]).
// Nothing ran, nothing was stored; a key whose answer was stored before
// is still replayed. Reported in [RequestEvent].Err; [Options].OnError hears
// about the bypass once, not about each refusal.
var ErrBypassRefused = errors.New("idemhttp: refused without running the handler: an earlier request wrote around this middleware's ResponseWriter")

// mountState is shared by every handler one [Middleware] call wraps. An
// adapter such as gin's usual one calls the returned func(http.Handler)
// for every request, so the state cannot live in the handler.
type mountState struct {
	bypassed atomic.Bool // a handler wrote around the middleware: refuse from now on
	warned   atomic.Bool // the loud report was made
	noScope  atomic.Bool // the loud report of a missing Options.Scope was made
	invalid  atomic.Bool // the loud report of an Options field out of range was made
}

// written is implemented by framework writers that know whether they sent
// a response (gin.ResponseWriter, negroni's).
type written interface{ Written() bool }

// statusReporter is implemented by framework writers that record the
// status a handler set (gin.ResponseWriter, chi's WrapResponseWriter).
type statusReporter interface{ Status() int }

// outerProbe remembers the ResponseWriter the middleware was given as it
// was before the handler ran. The handler gets the capture, not this
// writer. The writer may have changed while the handler ran: written,
// another status, other header fields. Then the handler reached it around
// the middleware, as gin's c.Writer does under the usual adapter
// (c.Request = r; c.Next()). The middleware cannot intercept that writer, only notice.
// An echo response says nothing afterwards, but calls its Before hooks
// when it is written: the probe registers one that notes a write while
// the handler runs.
type outerProbe struct {
	w        http.ResponseWriter
	header   http.Header
	written  bool
	status   int
	hooked   bool        // w runs Before hooks: hookSent says whether it was written
	running  atomic.Bool // the handler is running
	hookSent atomic.Bool // w was written while the handler ran
}

func probeOuter(w http.ResponseWriter) *outerProbe {
	p := &outerProbe{w: w}
	if h := w.Header(); len(h) > 0 { // usually empty: no copy
		p.header = h.Clone()
	}
	if ww, ok := w.(written); ok {
		p.written = ww.Written()
	}
	if ws, ok := w.(statusReporter); ok {
		p.status = ws.Status()
	}
	if ew, ok := w.(echoWriter); ok {
		p.hooked = true
		ew.Before(func() {
			if p.running.Load() {
				p.hookSent.Store(true)
			}
		})
	}
	return p
}

// serve runs the handler, watching the writer.
func (p *outerProbe) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	p.running.Store(true)
	defer p.running.Store(false)
	next.ServeHTTP(w, r)
}

// touched reports whether the writer changed since the probe was taken.
func (p *outerProbe) touched() bool {
	if ww, ok := p.w.(written); ok && !p.written && ww.Written() {
		return true
	}
	if p.hookSent.Load() {
		return true
	}
	if ws, ok := p.w.(statusReporter); ok && ws.Status() != p.status {
		return true
	}
	return !headerEqual(p.header, p.w.Header())
}

// sent reports whether the writer says it has sent a response: known is
// false for a writer that cannot tell (no Written method, no Before hook).
func (p *outerProbe) sent() (sent, known bool) {
	if p.hooked {
		return p.hookSent.Load(), true
	}
	ww, ok := p.w.(written)
	if !ok {
		return false, false
	}
	return ww.Written(), true
}

// restore puts the writer's header back as it was before the handler ran.
// So the problem the middleware answers carries none of the fields
// (Location, Content-Type) the handler set for its bypassed answer.
func (p *outerProbe) restore() {
	h := p.w.Header()
	for k := range h {
		delete(h, k)
	}
	for k, v := range p.header {
		h[k] = v
	}
}

// headerEqual reports whether a and b hold the same fields and values.
func headerEqual(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, av := range a {
		bv, ok := b[k]
		if !ok || !slices.Equal(av, bv) {
			return false
		}
	}
	return true
}

// bypassError is the error of the request whose handler wrote around the
// middleware; it matches [ErrWriterBypassed]. Its text is the loud report:
// what happened to this request and what to mount instead.
type bypassError struct {
	status  int  // the status the writer holds, 0 if it cannot tell
	sent    bool // the writer says the answer went out
	known   bool // the writer can tell whether it sent
	partial bool // the handler also wrote to the capture, judged as usual
	hint    string
}

// Error is the report: what happened, what to mount instead.
func (e *bypassError) Error() string {
	what := "the writer cannot tell whether it went out; the middleware's 500 was written after it"
	switch {
	case e.sent && e.status != 0:
		what = fmt.Sprintf("its status %d had already reached the client", e.status)
	case e.sent:
		what = "it had already reached the client"
	case e.known:
		what = "it had not been sent; the client got 500 instead"
	}
	done := "the handler's writes were rolled back and nothing was stored"
	if e.partial {
		done = "the part it wrote to the middleware's writer was stored and committed, or rolled back, as usual"
	}
	return "idemhttp: MISCONFIGURED: the handler wrote its answer to the ResponseWriter the middleware was given, " +
		"around the one the middleware passed to it (" + what + "); " + done + ". " +
		e.hint + ". From now on this middleware answers every guarded request 500 without running the handler " +
		"(answers stored before are still replayed)."
}

// Unwrap returns [ErrWriterBypassed].
func (e *bypassError) Unwrap() error { return ErrWriterBypassed }

// ginWriter has the methods only gin's ResponseWriter has.
type ginWriter interface {
	WriteHeaderNow()
	Pusher() http.Pusher
}

// echoWriter has the methods only echo's *Response has.
type echoWriter interface {
	Before(func())
	After(func())
}

// mountHint says what to mount instead, guessing the framework from the
// writer the middleware was given.
func mountHint(w http.ResponseWriter) string {
	switch w.(type) {
	case ginWriter:
		return "This is gin's usual net/http adapter (c.Request = r; c.Next(): gin's handlers write to c.Writer): " +
			"mount idemgin.Middleware (github.com/go-idempotency/idempotency/idemhttp/idemgin) instead"
	case echoWriter:
		return "This is an echo adapter that leaves c.Response() on echo's writer: " +
			"mount idemecho.Middleware (github.com/go-idempotency/idempotency/idemhttp/idemecho) instead"
	}
	return "The handler must write to the ResponseWriter it is given; on gin, echo or fiber mount " +
		"idemgin.Middleware, idemecho.Middleware or idemfiber.Middleware (github.com/go-idempotency/idempotency/idemhttp/...)"
}

// newBypass records the bypass (every later request is refused) and
// describes it.
func (h *handler[Tx]) newBypass(p *outerProbe, partial bool) *bypassError {
	h.st.bypassed.Store(true)
	e := &bypassError{hint: mountHint(p.w), partial: partial}
	e.sent, e.known = p.sent()
	if ws, ok := p.w.(statusReporter); ok && e.sent {
		e.status = ws.Status()
	}
	return e
}

// answerBypass ends the request whose handler wrote around the
// middleware. Its writes were rolled back. An answer the writer says it
// sent cannot be taken back: nothing more is written. Otherwise (not sent,
// or a writer that cannot tell) the handler's header fields are removed.
// The request is then answered 500 ProblemInternal. A pending status
// such as gin's c.Status(201) must not go out when the handler's writes
// were rolled back.
func (h *handler[Tx]) answerBypass(w http.ResponseWriter, r *http.Request, ev *RequestEvent, p *outerProbe, err *bypassError) {
	ev.Outcome, ev.Err = observe.Internal, err
	h.warn(r, err)
	if err.sent {
		ev.Status = err.status
		return
	}
	p.restore()
	h.problem(w, r, ev, &Problem{Type: problemInternal, Title: "Idempotency middleware failed", Status: http.StatusInternalServerError,
		Detail: "The idempotency middleware is mounted so that it cannot see the handler's answer; the operation was rolled back."})
}

// refuseBypassed answers a request refused after a bypass: the handler
// did not run, the key was released.
func (h *handler[Tx]) refuseBypassed(w http.ResponseWriter, r *http.Request, ev *RequestEvent) {
	ev.Outcome, ev.Err = observe.Internal, ErrBypassRefused
	h.problem(w, r, ev, &Problem{Type: problemInternal, Title: "Idempotency middleware failed", Status: http.StatusInternalServerError,
		Detail: "The idempotency middleware is mounted so that it cannot see the handler's answer; the request was not processed."})
}

// warn reports the bypass once per [Middleware], loudly. It goes to
// [Options].OnError or, without one, to the error log of the http.Server
// serving r. That is net/http's own choice for its errors: the log
// package's standard logger when the server has no ErrorLog.
func (h *handler[Tx]) warn(r *http.Request, err error) {
	h.warnOnce(&h.st.warned, r, err)
}

// warnOnce makes the loud report of err the first time flag is set:
// to [Options].OnError, or to the http.Server's error log.
func (h *handler[Tx]) warnOnce(flag *atomic.Bool, r *http.Request, err error) {
	if !flag.CompareAndSwap(false, true) {
		return
	}
	if h.c.onError != nil {
		h.c.onError(r, err)
		return
	}
	if srv, ok := r.Context().Value(http.ServerContextKey).(*http.Server); ok && srv.ErrorLog != nil {
		srv.ErrorLog.Print(err)
		return
	}
	log.Print(err)
}

// discard is the writer of an answer that must not be written: the
// handler's own, around the middleware, already went out.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) WriteHeader(int)             {}
func (discard) Write(p []byte) (int, error) { return len(p), nil }
