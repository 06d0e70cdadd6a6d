package idemhttp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/observe"
)

// Errors the middleware reports to [Options].OnError and in [RequestEvent].Err;
// match them with errors.Is.
var (
	// ErrNoResponse: the handler returned without writing anything: no
	// WriteHeader, no Write. Nothing is stored (an empty 200 would be
	// replayed for the key's whole TTL), its writes are rolled back, and the
	// client gets 500 ProblemNoResponse. It is the symptom of a framework
	// adapter that gives the handler another ResponseWriter than the one the
	// middleware passed. Examples are gin's c.Next() on c.Writer, an echo
	// handler that returns its error for echo to write later, and fiber's
	// adaptor. Use the idemgin, idemecho and idemfiber packages instead.
	ErrNoResponse = errors.New("idemhttp: the handler wrote no response")
	// ErrWriterBypassed: the handler wrote to the ResponseWriter the
	// middleware was given, instead of the one the middleware passed to it.
	// gin's handlers do so under the usual adapter (c.Request = r;
	// c.Next()). Detected when that writer changed while the handler ran:
	// it reports Written() or another Status() (gin's does), it ran its
	// Before hooks (echo's does), or its header fields changed.
	//
	// When the handler wrote nothing to the middleware's writer, its writes
	// are rolled back and nothing is stored. An answer the writer says it
	// sent has reached the client and cannot be taken back. Any other is
	// replaced by 500 ProblemInternal.
	//
	// The handler may have written to both, as an adapter does that routes
	// only some of gin's writer methods to c.Writer. Then the part the
	// middleware saw is stored or rolled back as usual. Nothing more is
	// written to a writer that says it sent.
	//
	// From then on the same [Middleware] refuses every guarded request
	// before running the handler ([ErrBypassRefused]). The error, in
	// [RequestEvent].Err and once in [Options].OnError, says what to mount
	// instead (idemgin, idemecho, idemfiber).
	ErrWriterBypassed = errors.New("idemhttp: the handler wrote around the middleware's ResponseWriter")
	// ErrResponseTooLarge: the handler's response body went past
	// [Options].MaxResponseBody; rolled back, answered 500
	// ProblemResponseTooLarge.
	ErrResponseTooLarge = errResponseTooLarge
)

// Middleware returns a middleware that runs guarded requests (see
// [Options].Methods) through g. The first request with a key runs the
// handler inside g's transaction, and stores its response with the key.
// Later requests with the same key and fingerprint get that response
// replayed. See the package documentation for the statuses it answers.
//
// The handler finds the transaction with [idempotency.TxFrom] and must do every write
// of the operation through it. The fingerprint is the method, the route
// ([Options].Route), the media type and the body, plus
// [Options].FingerprintHeaders. The body counts as canonical JSON for
// application/json and +json types (the canonical JSON of [idempotency.FingerprintJSON]), as its
// canonical form for application/x-www-form-urlencoded
// (the canonical form of [idempotency.FingerprintForm]), and as its bytes otherwise. An empty
// body is never parsed.
//
// cfg.Scope is required: it says whose key space a request's key is in.
// Mounted without it (nil cfg included), the middleware shares answers
// with nobody: it answers every request of a guarded method 500
// ProblemInternal without running the handler ([ErrNoScope], reported
// once). A service with a single tenant says so with [SharedScope]. The
// refusal is a 500 rather than an error returned here. So Middleware keeps
// the shape every router's Use takes, and still never panics. Call
// [Options.Validate] to fail at start-up instead.
//
// A nil g makes every guarded request fail with 500 ProblemInternal: the
// handler never runs unprotected.
func Middleware[Tx any](g *idempotency.Guard[Tx], cfg *Options) func(http.Handler) http.Handler {
	c := newSettings(cfg)
	if c.invalid == nil && c.ttl != 0 && g != nil {
		v, err := g.WithTTL(c.ttl) // once: the view shares g's in-memory queue
		if err != nil {
			c.invalid = err
		} else {
			g = v
		}
	}
	st := &mountState{}
	return func(next http.Handler) http.Handler {
		return &handler[Tx]{g: g, c: c, st: st, next: next}
	}
}

type handler[Tx any] struct {
	g    *idempotency.Guard[Tx]
	c    *settings
	st   *mountState
	next http.Handler
}

// handlerFailure carries a response that must not be stored (a 5xx, or a
// status [Options].KeepStatus refuses) out of Guard.Do, which rolls back on any
// error.
type handlerFailure struct{ c *capture }

func (f *handlerFailure) Error() string {
	return fmt.Sprintf("idemhttp: handler answered %d; rolled back, not stored", f.c.status)
}

func (h *handler[Tx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.c.methods[r.Method] {
		h.next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(h.c.header)
	if len(values) == 0 && h.c.optional && h.c.scope != nil {
		h.next.ServeHTTP(w, r)
		return
	}
	ev := &RequestEvent{Method: r.Method, Outcome: observe.HandlerError}
	if h.c.observer == nil {
		h.serve(w, r, values, ev)
		return
	}
	report := h.observe(r, ev)
	finished := false
	defer func() {
		if !finished { // the handler panicked (re-raised): rolled back
			ev.Outcome, ev.Status, ev.Err = observe.HandlerError, 0, errors.New("idemhttp: the handler panicked")
		}
		report()
	}()
	h.serve(w, r, values, ev)
	finished = true
}

// observe starts ev's clock for the Observer, if one is set; the returned
// func (deferred by the caller) sets ev's Duration and reports it.
func (h *handler[Tx]) observe(r *http.Request, ev *RequestEvent) (report func()) {
	if h.c.observer == nil {
		return func() {}
	}
	start := time.Now()
	ev.Route = h.c.route(r)
	return func() {
		ev.Duration = time.Since(start)
		h.c.observer(r.Context(), *ev)
	}
}

// admit checks a guarded request before the store is reached: its key
// (values are its key header's), scope, body and fingerprint. It answers
// the client and returns false when the request is refused.
func (h *handler[Tx]) admit(w http.ResponseWriter, r *http.Request, values []string, ev *RequestEvent) (key idempotency.Key, body []byte, fp string, ok bool) {
	switch {
	case h.c.scope == nil:
		h.refuseNoScope(w, r, ev)
		return key, nil, "", false
	case h.c.invalid != nil:
		h.refuseInvalid(w, r, ev)
		return key, nil, "", false
	case len(values) == 0:
		h.reject(w, r, ev, &Problem{Type: problemMissingKey, Title: h.c.header + " is missing", Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("%s requests to this resource require an %s header.", r.Method, h.c.header)}, nil)
		return key, nil, "", false
	case len(values) > 1:
		h.invalidKey(w, r, ev, fmt.Errorf("%w: the %s header appears more than once", idempotency.ErrInvalidKey, h.c.header))
		return key, nil, "", false
	}
	id, err := parseKey(values[0])
	if err == nil {
		err = idempotency.Key{ID: id}.Validate()
	}
	if err == nil && h.c.echo {
		h.echoKey(w, values[0])
	}
	if err == nil && h.c.validate != nil {
		if err = h.c.validate(id); err != nil && !errors.Is(err, idempotency.ErrInvalidKey) {
			err = fmt.Errorf("%w: %w", idempotency.ErrInvalidKey, err)
		}
	}
	if err != nil {
		h.invalidKey(w, r, ev, err)
		return key, nil, "", false
	}
	ev.Key.ID = id
	if h.g == nil {
		h.internal(w, r, ev, errors.New("idemhttp: Middleware was given a nil Guard"))
		return key, nil, "", false
	}
	key = idempotency.Key{ID: id}
	if key.Scope, err = h.c.scope(r); err != nil {
		if p, ok := errors.AsType[*Problem](err); ok {
			h.reject(w, r, ev, p, err)
			return key, nil, "", false
		}
		h.internal(w, r, ev, fmt.Errorf("idemhttp: Options.Scope: %w", err))
		return key, nil, "", false
	}
	if err := key.Validate(); err != nil {
		h.internal(w, r, ev, fmt.Errorf("idemhttp: Options.Scope returned an invalid scope: %w", err))
		return key, nil, "", false
	}
	ev.Key.Scope = key.Scope
	body, ok = h.readBody(w, r, ev)
	if !ok {
		return key, nil, "", false
	}
	fp, err = h.fingerprint(r, body)
	if err != nil {
		p, ok := errors.AsType[*Problem](err)
		if !ok {
			title := "Request body is not valid JSON"
			if errors.Is(err, idempotency.ErrInvalidBody) {
				title = "Request body is not a valid form"
			}
			p = &Problem{Type: problemInvalidBody, Title: title, Status: http.StatusBadRequest, Detail: err.Error()}
		}
		h.reject(w, r, ev, p, err)
		return key, nil, "", false
	}

	return key, body, fp, true
}

func (h *handler[Tx]) serve(w http.ResponseWriter, r *http.Request, values []string, ev *RequestEvent) {
	key, body, fp, ok := h.admit(w, r, values, ev)
	if !ok {
		return
	}
	var first *capture
	var partial *bypassError // the handler wrote to both writers
	outer := probeOuter(w)
	runs := 0
	arrived := time.Now() // before the key's holder, if any, could answer
	fn := func(tx Tx) (idempotency.Response, error) {
		// fn runs again after a retryable store conflict: every run gets a
		// fresh writer and a fresh body.
		if runs++; runs == 1 && h.st.bypassed.Load() {
			// An earlier request wrote around this middleware: running the
			// handler could tell the client an answer that is rolled back.
			// Stored answers are still replayed (fn does not run for them).
			// A request already running finishes its retries.
			return idempotency.Response{}, ErrBypassRefused
		}
		cw := newCapture(w, h.c.maxResp)
		first, partial = cw, nil
		ctx := idempotency.WithTx(r.Context(), tx, key)
		req := r.WithContext(ctx)
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		req.ContentLength = int64(len(body))
		outer.serve(h.next, cw, req)
		touched := outer.touched()
		if cw.status == 0 { // nothing written: never store an answer the handler did not give
			if touched { // it went around cw, to the client
				return idempotency.Response{}, h.newBypass(outer, false)
			}
			return idempotency.Response{}, ErrNoResponse
		}
		if touched {
			// Part of the answer went around cw (an adapter that routes
			// some of gin's writer methods to c.Writer): cw's answer is
			// judged as usual, and later requests are refused.
			partial = h.newBypass(outer, true)
		}
		cw.finish()
		switch {
		case cw.over:
			return idempotency.Response{}, errResponseTooLarge
		case cw.status >= 500 || !h.c.store(cw.status):
			return idempotency.Response{}, &handlerFailure{c: cw}
		}
		return idempotency.Response{Status: cw.status, Header: h.c.storedHeader(cw.sent), Body: cw.body.Bytes()}, nil
	}
	resp, gev, err := h.do(r, key, fp, fn) // quota.go
	if errors.Is(err, idempotency.ErrMismatch) {
		resp, gev, err = h.byteForm(r, key, body, fp, fn, resp, gev, err) // fingerprint.go
	}
	ev.Waited, ev.RecordAge, ev.AfterFn = gev.Waited, gev.RecordAge, gev.AfterFn
	if be, ok := errors.AsType[*bypassError](err); ok {
		h.answerBypass(w, r, ev, outer, be)
		return
	}
	if partial != nil {
		h.warn(r, partial)
		if partial.sent {
			w = discard{} // what went out cannot be taken back or added to
		}
		defer func() {
			ev.Err = partial
			if partial.sent {
				ev.Status = partial.status
			}
		}()
	}
	switch {
	case err == nil && resp.Replayed:
		ev.Outcome, ev.Status = observe.Replayed, resp.Status
		writeResponse(w, resp.Status, h.c.storedHeader(resp.Header), resp.Body, true, h.lifetime(resp.ExpiresAt))
	case err == nil:
		ev.Outcome, ev.Status = observe.Executed, first.status
		writeResponse(w, first.status, first.sent, first.body.Bytes(), false, h.lifetime(resp.ExpiresAt))
	default:
		h.fail(w, r, ev, err, arrived)
	}
}

// lifetime returns what writeResponse adds to a stored answer: the key's
// expiry and, if asked, the names a browser may read.
func (h *handler[Tx]) lifetime(expires time.Time) func(http.Header) {
	return func(hd http.Header) {
		if !expires.IsZero() {
			hd.Set(HeaderKeyExpires, formatExpiry(expires))
		}
		if h.c.expose {
			expose(hd, HeaderReplayed, HeaderKeyExpires)
		}
	}
}

// formatExpiry writes t as an IMF-fixdate, rounded down to the second.
func formatExpiry(t time.Time) string { return t.UTC().Format(http.TimeFormat) }

// expose adds names to the Access-Control-Expose-Headers of hd, keeping
// the names already listed and never repeating one.
func expose(hd http.Header, names ...string) {
	listed := map[string]bool{}
	for _, v := range hd.Values("Access-Control-Expose-Headers") {
		for _, n := range strings.Split(v, ",") {
			listed[strings.ToLower(strings.TrimSpace(n))] = true
		}
	}
	var add []string
	for _, n := range names {
		if !listed[strings.ToLower(n)] && !listed["*"] {
			listed[strings.ToLower(n)] = true
			add = append(add, n)
		}
	}
	if len(add) > 0 {
		hd.Add("Access-Control-Expose-Headers", strings.Join(add, ", "))
	}
}

// readBody reads the whole request body within the limit. It answers the
// client and returns false when the body is too large or unreadable.
func (h *handler[Tx]) readBody(w http.ResponseWriter, r *http.Request, ev *RequestEvent) ([]byte, bool) {
	tooLarge := func(err error) {
		h.reject(w, r, ev, &Problem{Type: problemRequestTooLarge, Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("The request body exceeds %d bytes.", h.c.maxReq)}, err)
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true
	}
	if h.c.maxReq >= 0 && r.ContentLength > h.c.maxReq {
		tooLarge(&http.MaxBytesError{Limit: h.c.maxReq})
		return nil, false
	}
	src := r.Body
	if h.c.maxReq >= 0 {
		src = http.MaxBytesReader(w, r.Body, h.c.maxReq)
	}
	body, err := io.ReadAll(src)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			tooLarge(err)
			return nil, false
		}
		h.reject(w, r, ev, &Problem{Type: problemInvalidBody, Title: "Request body could not be read", Status: http.StatusBadRequest,
			Detail: err.Error()}, err)
		return nil, false
	}
	return body, true
}
