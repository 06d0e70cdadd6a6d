package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/textproto"
	"strings"

	"github.com/go-idempotency/idempotency"
)

// Defaults of [Options].
const (
	// DefaultMaxRequestBody is the default [Options].MaxRequestBody: 1 MiB.
	DefaultMaxRequestBody = 1 << 20
	// DefaultMaxResponseBody is the default [Options].MaxResponseBody: 1 MiB.
	DefaultMaxResponseBody = 1 << 20
)

// DefaultMethods returns the methods that require a key by default: POST and
// PATCH.
func DefaultMethods() []string { return []string{http.MethodPost, http.MethodPatch} }

// DefaultReplayHeaders returns the default [Options].ReplayHeaders: the
// representation and location fields a replay needs to mean what the first
// response meant. Cache-Control, Content-Disposition, Content-Encoding,
// Content-Language, Content-Location, Content-Type, ETag, Expires,
// Last-Modified, Link, Location, Vary.
func DefaultReplayHeaders() []string {
	return []string{
		"Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language",
		"Content-Location", "Content-Type", "ETag", "Expires", "Last-Modified", "Link",
		"Location", "Vary",
	}
}

// Options configure [Middleware]. The zero value (or nil) means the defaults.
type Options struct {
	// Methods are the request methods the middleware guards. Requests with
	// other methods go to the handler untouched, without a transaction.
	// Defaults to [DefaultMethods] (POST and PATCH).
	Methods []string

	// KeyOptional lets a guarded request without an Idempotency-Key through
	// to the handler unprotected (no transaction in its context). Defaults
	// to false: such a request is refused with 400 [ProblemMissingKey].
	KeyOptional bool

	// Scope returns the key space of a request, typically the authenticated
	// account: the same key in two scopes never meets. It runs after the
	// key is parsed and before the body is read. An error that is (or wraps)
	// a *[Problem] is answered as that problem (e.g. 401); any other error
	// gives 500 [ProblemInternal].
	//
	// Defaults to nil: the empty scope, one key space shared by every
	// client. A multi-tenant service MUST set Scope, or one client's key
	// can replay another client's response.
	Scope func(*http.Request) (string, error)

	// Route returns the route part of the fingerprint. Defaults to
	// r.URL.RequestURI(): the path and the query string, so the same key on
	// another URL (?currency=EUR instead of USD) is refused with 422 rather
	// than replayed. Return r.URL.Path to leave the query out.
	Route func(*http.Request) string

	// MaxRequestBody is the largest request body accepted, in bytes; a
	// larger one is refused with 413 [ProblemRequestTooLarge] before
	// anything is stored. The body is held in memory to fingerprint it and
	// to hand it to the handler. Defaults to [DefaultMaxRequestBody]; a
	// negative value means no limit.
	MaxRequestBody int64

	// MaxResponseBody is the largest response body the handler may write,
	// in bytes; the response is buffered and stored. Past it the handler's
	// Write returns an error, its writes are rolled back, the key stays
	// free and the client gets 500 [ProblemResponseTooLarge]. Defaults to
	// [DefaultMaxResponseBody]; a negative value means no limit (the store
	// may still refuse a body larger than its column).
	MaxResponseBody int64

	// ReplayHeaders are the response header fields stored with the key and
	// replayed (compared case-insensitively). Set-Cookie and the hop-by-hop
	// fields (Connection and the fields it names, Keep-Alive, Proxy-*, TE,
	// Trailer, Transfer-Encoding, Upgrade) are never stored, even if listed;
	// neither are Content-Length (recomputed) and Date. Defaults to
	// [DefaultReplayHeaders]; a non-nil empty slice stores no header.
	ReplayHeaders []string

	// Transient reports whether a status below 500 written by the handler
	// means "try again later": such a response is sent to the client but
	// rolled back with the handler's writes and not stored, like a 5xx.
	// Defaults to 408, 425 and 429 (which clients retry with the same key,
	// and which would otherwise be replayed until the key expires).
	Transient func(status int) bool

	// OnError, if set, is called with the cause of every 500 and 503 the
	// middleware answers itself (store failures included), for logging;
	// not when the client went away (its request context was cancelled).
	OnError func(r *http.Request, err error)
}

type config struct {
	methods   map[string]bool
	optional  bool
	scope     func(*http.Request) (string, error)
	route     func(*http.Request) string
	maxReq    int64
	maxResp   int64
	replay    map[string]bool
	transient func(int) bool
	onError   func(*http.Request, error)
}

func newConfig(o *Options) *config {
	if o == nil {
		o = &Options{}
	}
	c := &config{
		methods:   map[string]bool{},
		optional:  o.KeyOptional,
		scope:     o.Scope,
		route:     o.Route,
		maxReq:    o.MaxRequestBody,
		maxResp:   o.MaxResponseBody,
		replay:    map[string]bool{},
		transient: o.Transient,
		onError:   o.OnError,
	}
	methods := o.Methods
	if methods == nil {
		methods = DefaultMethods()
	}
	for _, m := range methods {
		c.methods[strings.ToUpper(m)] = true
	}
	if c.route == nil {
		c.route = func(r *http.Request) string { return r.URL.RequestURI() }
	}
	if c.maxReq == 0 {
		c.maxReq = DefaultMaxRequestBody
	}
	if c.maxResp == 0 {
		c.maxResp = DefaultMaxResponseBody
	}
	replay := o.ReplayHeaders
	if replay == nil {
		replay = DefaultReplayHeaders()
	}
	for _, name := range replay {
		if name = textproto.CanonicalMIMEHeaderKey(name); !neverStored(name) {
			c.replay[name] = true
		}
	}
	if c.transient == nil {
		c.transient = func(s int) bool {
			return s == http.StatusRequestTimeout || s == http.StatusTooEarly || s == http.StatusTooManyRequests
		}
	}
	return c
}

// neverStored reports whether the canonical field name may never be stored
// or replayed, whatever the allowlist says.
func neverStored(name string) bool {
	switch name {
	case "Set-Cookie", "Set-Cookie2", "Connection", "Keep-Alive", "Te", "Trailer",
		"Transfer-Encoding", "Upgrade", "Content-Length", "Date", HeaderReplayed:
		return true
	}
	return strings.HasPrefix(name, "Proxy-")
}

// storedHeader returns the fields of h that the allowlist keeps, minus any
// field that h's Connection header nominates as hop-by-hop.
func (c *config) storedHeader(h http.Header) http.Header {
	var nominated map[string]bool
	for _, v := range h.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				if nominated == nil {
					nominated = map[string]bool{}
				}
				nominated[textproto.CanonicalMIMEHeaderKey(f)] = true
			}
		}
	}
	out := http.Header{}
	for k, v := range h {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if c.replay[ck] && !nominated[ck] && len(v) > 0 {
			out[ck] = append(out[ck], v...)
		}
	}
	return out
}

// Middleware returns a middleware that runs guarded requests (see
// [Options].Methods) through g: the first request with a key runs the
// handler inside g's transaction and stores its response with the key;
// later requests with the same key and fingerprint get that response
// replayed. See the package documentation for the statuses it answers.
//
// The handler finds the transaction with [TxFrom] and must do every write
// of the operation through it. The fingerprint is the method, the route
// ([Options].Route), the media type and the body (canonical JSON for
// application/json and +json types, the bytes otherwise; an empty body is
// never parsed).
//
// A nil g makes every guarded request fail with 500 [ProblemInternal]: the
// handler never runs unprotected.
func Middleware[Tx any](g *idempotency.Guard[Tx], opts *Options) func(http.Handler) http.Handler {
	c := newConfig(opts)
	return func(next http.Handler) http.Handler {
		return &handler[Tx]{g: g, c: c, next: next}
	}
}

type handler[Tx any] struct {
	g    *idempotency.Guard[Tx]
	c    *config
	next http.Handler
}

type txKey struct{}

type keyKey struct{}

// TxFrom returns the transaction [Middleware] opened for the request whose
// context is ctx. ok is false outside a guarded request (another method, or
// an optional key left out) or when Tx is not the guard's transaction type.
func TxFrom[Tx any](ctx context.Context) (tx Tx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(Tx)
	return tx, ok
}

// KeyFrom returns the key (scope and id) of a guarded request, e.g. to
// derive keys for calls to other services.
func KeyFrom(ctx context.Context) (idempotency.Key, bool) {
	k, ok := ctx.Value(keyKey{}).(idempotency.Key)
	return k, ok
}

// handlerFailure carries a 5xx or transient response out of Guard.Do, which
// rolls back on any error.
type handlerFailure struct{ c *capture }

func (f *handlerFailure) Error() string {
	return fmt.Sprintf("idemhttp: handler answered %d; rolled back", f.c.status)
}

func (h *handler[Tx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.c.methods[r.Method] {
		h.next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(HeaderKey)
	switch {
	case len(values) == 0 && h.c.optional:
		h.next.ServeHTTP(w, r)
		return
	case len(values) == 0:
		writeProblem(w, &Problem{Type: ProblemMissingKey, Title: "Idempotency-Key is missing", Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("%s requests to this resource require an Idempotency-Key header.", r.Method)}, 0)
		return
	case len(values) > 1:
		h.invalidKey(w, "the Idempotency-Key header appears more than once")
		return
	}
	id, err := parseKey(values[0])
	if err == nil {
		err = idempotency.Key{ID: id}.Validate()
	}
	if err != nil {
		h.invalidKey(w, err.Error())
		return
	}
	if h.g == nil {
		h.internal(w, r, errors.New("idemhttp: Middleware was given a nil Guard"))
		return
	}
	key := idempotency.Key{ID: id}
	if h.c.scope != nil {
		if key.Scope, err = h.c.scope(r); err != nil {
			if p, ok := errors.AsType[*Problem](err); ok {
				writeProblem(w, p, 0)
				return
			}
			h.internal(w, r, fmt.Errorf("idemhttp: Options.Scope: %w", err))
			return
		}
		if err := key.Validate(); err != nil {
			h.internal(w, r, fmt.Errorf("idemhttp: Options.Scope returned an invalid scope: %w", err))
			return
		}
	}
	body, ok := h.readBody(w, r)
	if !ok {
		return
	}
	fp, err := h.fingerprint(r, body)
	if err != nil {
		writeProblem(w, &Problem{Type: ProblemInvalidBody, Title: "Request body is not valid JSON", Status: http.StatusBadRequest,
			Detail: err.Error()}, 0)
		return
	}

	var first *capture
	resp, err := h.g.Do(r.Context(), key, fp, func(tx Tx) (idempotency.Response, error) {
		// fn runs again after a retryable store conflict: every run gets a
		// fresh writer and a fresh body.
		cw := newCapture(w, h.c.maxResp)
		first = cw
		ctx := context.WithValue(context.WithValue(r.Context(), txKey{}, tx), keyKey{}, key)
		req := r.WithContext(ctx)
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		req.ContentLength = int64(len(body))
		h.next.ServeHTTP(cw, req)
		cw.finish()
		switch {
		case cw.over:
			return idempotency.Response{}, errResponseTooLarge
		case cw.status >= 500 || h.c.transient(cw.status):
			return idempotency.Response{}, &handlerFailure{c: cw}
		}
		return idempotency.Response{Status: cw.status, Header: h.c.storedHeader(cw.sent), Body: cw.body.Bytes()}, nil
	})
	switch {
	case err == nil && resp.Replayed:
		writeResponse(w, resp.Status, h.c.storedHeader(resp.Header), resp.Body, true)
	case err == nil:
		writeResponse(w, first.status, first.sent, first.body.Bytes(), false)
	default:
		h.fail(w, r, err)
	}
}

func (h *handler[Tx]) invalidKey(w http.ResponseWriter, detail string) {
	writeProblem(w, &Problem{Type: ProblemInvalidKey, Title: "Idempotency-Key is invalid", Status: http.StatusBadRequest,
		Detail: detail + "; send 1 to 255 printable ASCII characters, bare or as a quoted sf-string."}, 0)
}

func (h *handler[Tx]) internal(w http.ResponseWriter, r *http.Request, err error) {
	if h.c.onError != nil {
		h.c.onError(r, err)
	}
	writeProblem(w, &Problem{Type: ProblemInternal, Title: "Idempotency middleware failed", Status: http.StatusInternalServerError}, 0)
}

// fail answers an error returned by Guard.Do.
func (h *handler[Tx]) fail(w http.ResponseWriter, r *http.Request, err error) {
	if f, ok := errors.AsType[*handlerFailure](err); ok {
		// The handler's own 5xx (or transient) response, rolled back.
		writeResponse(w, f.c.status, f.c.sent, f.c.body.Bytes(), false)
		return
	}
	switch {
	case errors.Is(err, idempotency.ErrMismatch):
		writeProblem(w, &Problem{Type: ProblemKeyReused, Title: "Idempotency-Key is already used", Status: http.StatusUnprocessableEntity,
			Detail: "This key was used with a different request (method, route or body); use a new key for a new request."}, 0)
		return
	case errors.Is(err, idempotency.ErrInProgress):
		writeProblem(w, &Problem{Type: ProblemInProgress, Title: "A request with this Idempotency-Key is in progress", Status: http.StatusConflict,
			Detail: "Retry later with the same key to get its response."}, 1)
		return
	}
	if h.c.onError != nil && !(errors.Is(err, context.Canceled) && r.Context().Err() != nil) {
		h.c.onError(r, err) // not for a client that went away
	}
	switch {
	case errors.Is(err, errResponseTooLarge):
		writeProblem(w, &Problem{Type: ProblemResponseTooLarge, Title: "Response too large to store", Status: http.StatusInternalServerError,
			Detail: "The response was larger than the idempotency store accepts; the operation was rolled back."}, 0)
	case errors.Is(err, idempotency.ErrInvalidResponse), errors.Is(err, idempotency.ErrInvalidKey), errors.Is(err, idempotency.ErrInvalidFingerprint):
		writeProblem(w, &Problem{Type: ProblemInternal, Title: "Idempotency middleware failed", Status: http.StatusInternalServerError}, 0)
	default:
		writeProblem(w, &Problem{Type: ProblemStoreUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable,
			Detail: "The request was not processed (or was rolled back); retry later with the same key."}, 1)
	}
}

// readBody reads the whole request body within the limit. It answers the
// client and returns false when the body is too large or unreadable.
func (h *handler[Tx]) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	tooLarge := func() {
		writeProblem(w, &Problem{Type: ProblemRequestTooLarge, Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("The request body exceeds %d bytes.", h.c.maxReq)}, 0)
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true
	}
	if h.c.maxReq >= 0 && r.ContentLength > h.c.maxReq {
		tooLarge()
		return nil, false
	}
	src := r.Body
	if h.c.maxReq >= 0 {
		src = http.MaxBytesReader(w, r.Body, h.c.maxReq)
	}
	body, err := io.ReadAll(src)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			tooLarge()
			return nil, false
		}
		writeProblem(w, &Problem{Type: ProblemInvalidBody, Title: "Request body could not be read", Status: http.StatusBadRequest,
			Detail: err.Error()}, 0)
		return nil, false
	}
	return body, true
}

// fingerprint hashes method, route, media type and body (canonical JSON for
// JSON media types).
func (h *handler[Tx]) fingerprint(r *http.Request, body []byte) (string, error) {
	ct := r.Header.Get("Content-Type")
	media, _, err := mime.ParseMediaType(ct)
	if err != nil {
		media = strings.ToLower(strings.TrimSpace(ct))
	}
	if len(body) > 0 && isJSON(media) {
		canon, err := idempotency.CanonicalJSON(body)
		if err != nil {
			return "", err
		}
		body = canon
	}
	return idempotency.Fingerprint([]byte(r.Method), []byte(h.c.route(r)), []byte(media), body), nil
}

func isJSON(media string) bool {
	return media == "application/json" || strings.HasSuffix(media, "+json")
}
