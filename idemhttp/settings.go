package idemhttp

import (
	"context"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
)

// Defaults of [Options].
const (
	// defaultMaxRequestBody is the default [Options].MaxRequestBody: 1 MiB.
	defaultMaxRequestBody = 1 << 20
	// defaultMaxResponseBody is the default [Options].MaxResponseBody: 1 MiB.
	defaultMaxResponseBody = 1 << 20
)

// defaultMethods returns the methods that require a key by default: POST and
// PATCH.
func defaultMethods() []string { return []string{http.MethodPost, http.MethodPatch} }

// defaultReplayHeaders returns the default [Options].ReplayHeaders: the
// representation and location fields a replay needs to mean what the first
// response meant. Cache-Control, Content-Disposition, Content-Encoding,
// Content-Language, Content-Location, Content-Type, ETag, Expires,
// Last-Modified, Link, Location, Vary.
func defaultReplayHeaders() []string {
	return []string{
		"Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language",
		"Content-Location", "Content-Type", "ETag", "Expires", "Last-Modified", "Link",
		"Location", "Vary",
	}
}

// DefaultKeepStatus is the default [Options].KeepStatus. It reports whether a status
// written by the handler is the result of the operation, to be stored with
// the key and replayed. Otherwise it is an answer the client should be able
// to retry with the same key.
//
// Stored: 2xx and 3xx, and the 4xx that are the operation's own outcome,
// such as 402 (payment declined), 410 or 412.
//
// Not stored (the handler's writes are rolled back, the key stays free, the
// response is still sent):
//
//   - every 5xx;
//   - the "try again" statuses 408, 409, 425 and 429;
//   - the request-validation and access failures 400, 401, 403, 404, 405,
//     413, 415, 422 and 431. The client fixes them (its credentials, a
//     malformed field, a resource it creates first) and resends with the
//     same key.
//
// The policy: store an outcome, never a failure to produce one. A stored
// answer commits in one transaction with the handler's writes, so it
// stands for what they did. A 5xx rolls those writes back with the key:
// nothing happened that a replay could stand for, and a retry with the
// same key runs the operation, once. (Stripe stores and replays its 5xx,
// because effects of its own, such as a card network's, may have happened
// and cannot be rolled back. Effects outside the transaction are the
// handler's to make idempotent here: [idempotency.Key.Derive] for calls
// to other services, or an [idempotency.Operation]'s steps.) Like Stripe,
// it saves nothing for a request that failed validation or conflicted
// with another one: storing a 400 would replay it for the key's whole
// TTL, even after the client corrected the request. (A corrected body is
// a new fingerprint, and would get 422 instead.)
func DefaultKeepStatus(status int) bool {
	switch {
	case status < 200 || status >= 500:
		return false
	case status < 400:
		return true
	}
	switch status {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound,
		http.StatusMethodNotAllowed, http.StatusRequestTimeout, http.StatusConflict,
		http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity,
		http.StatusTooEarly, http.StatusTooManyRequests, http.StatusRequestHeaderFieldsTooLarge:
		return false
	}
	return true
}

type settings struct {
	methods   map[string]bool
	header    string
	optional  bool
	validate  func(string) error
	scope     func(*http.Request) (string, error)
	route     func(*http.Request) string
	fpHeaders []string
	ignore    [][]string
	fpFunc    func(*http.Request, []byte) (string, error)
	maxReq    int64
	maxResp   int64
	replay    map[string]bool
	store     func(int) bool
	render    func(http.ResponseWriter, *http.Request, *Problem)
	echo      bool
	onError   func(*http.Request, error)
	observer  func(context.Context, RequestEvent)
	ttl       time.Duration
	expose    bool
	link      string // the Link field value of problems; "" for none
	progress  int    // the status of the in-progress answer
	onHeld    func(http.ResponseWriter, *http.Request, idempotency.Key) bool
	invalid   error              // an Options error other than a missing Scope: refuse every request
	quota     *idempotency.Quota // a copy of Options.Quota
}

func newSettings(o *Options) *settings {
	if o == nil {
		o = &Options{}
	}
	c := &settings{
		methods:  map[string]bool{},
		header:   o.KeyHeader,
		optional: o.KeyOptional,
		validate: o.ValidateKey,
		scope:    o.Scope,
		route:    o.Route,
		fpFunc:   o.Fingerprint,
		maxReq:   o.MaxRequestBody,
		maxResp:  o.MaxResponseBody,
		replay:   map[string]bool{},
		store:    o.KeepStatus,
		render:   o.RenderProblem,
		echo:     o.EchoKey,
		onError:  o.OnError,
		observer: o.Observer,
		ttl:      o.TTL,
		expose:   o.ExposeHeaders,
		progress: o.InProgressStatus,
		onHeld:   o.InProgress,
		invalid:  o.check(),
	}
	if o.ProblemDocs != "" {
		c.link = "<" + o.ProblemDocs + `>; rel="describedby"`
	}
	if c.progress == 0 {
		c.progress = http.StatusConflict
	}
	if o.Quota != nil {
		q := *o.Quota
		c.quota = &q
	}
	if c.header == "" {
		c.header = DefaultKeyHeader
	}
	c.header = textproto.CanonicalMIMEHeaderKey(c.header)
	methods := o.Methods
	if methods == nil {
		methods = defaultMethods()
	}
	for _, m := range methods {
		c.methods[strings.ToUpper(m)] = true
	}
	if c.route == nil {
		c.route = func(r *http.Request) string { return r.URL.RequestURI() }
	}
	for _, h := range o.FingerprintHeaders {
		c.fpHeaders = append(c.fpHeaders, textproto.CanonicalMIMEHeaderKey(h))
	}
	for _, f := range o.IgnoreFields {
		if f != "" {
			c.ignore = append(c.ignore, strings.Split(f, "."))
		}
	}
	if c.maxReq == 0 {
		c.maxReq = defaultMaxRequestBody
	}
	if c.maxResp == 0 {
		c.maxResp = defaultMaxResponseBody
	}
	replay := o.ReplayHeaders
	if replay == nil {
		replay = defaultReplayHeaders()
	}
	for _, name := range replay {
		if name = textproto.CanonicalMIMEHeaderKey(name); !neverStored(name) {
			c.replay[name] = true
		}
	}
	if c.store == nil {
		c.store = DefaultKeepStatus
	}
	if c.render == nil {
		c.render = func(w http.ResponseWriter, _ *http.Request, p *Problem) { WriteProblem(w, p) }
	}
	return c
}

// neverStored reports whether the canonical field name may never be stored
// or replayed, whatever the allowlist says.
func neverStored(name string) bool {
	switch name {
	case "Set-Cookie", "Set-Cookie2", "Connection", "Keep-Alive", "Te", "Trailer",
		"Transfer-Encoding", "Upgrade", "Content-Length", "Date", HeaderReplayed, HeaderKeyExpires:
		return true
	}
	return strings.HasPrefix(name, "Proxy-")
}

// storedHeader returns the fields of h that the allowlist keeps, minus any
// field that h's Connection header nominates as hop-by-hop.
func (c *settings) storedHeader(h http.Header) http.Header {
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
