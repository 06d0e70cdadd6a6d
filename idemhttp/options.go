package idemhttp

import (
	"context"
	"net/http"
	"time"

	"github.com/go-idempotency/idempotency"
)

// Options configures [Middleware]. Scope is required; every other field's
// zero value means its default.
type Options struct {
	// Methods are the request methods the middleware guards. Requests with
	// other methods go to the handler untouched, without a transaction.
	// Defaults to POST and PATCH.
	Methods []string

	// KeyHeader is the request header that carries the key. Defaults to
	// [DefaultKeyHeader] ("Idempotency-Key"); many APIs use "X-Idempotency-Key".
	KeyHeader string

	// KeyOptional lets a guarded request without a key through to the
	// handler unprotected (no transaction in its context). Defaults to
	// false: such a request is refused with 400 ProblemMissingKey.
	KeyOptional bool

	// ValidateKey, if set, is called with the parsed key id (already known
	// to be 1 to 255 printable ASCII bytes) before anything is stored. An
	// error refuses the request with 400 ProblemInvalidKey and the error's
	// text as detail; an error that is (or wraps) a *[Problem] is answered
	// as that problem. The draft's security considerations recommend
	// refusing low-entropy keys: see [MinKeyLength] and [UUIDKey].
	ValidateKey func(id string) error

	// Scope returns the key space of a request, typically the authenticated
	// account: the same key in two scopes never meets. It runs after the
	// key is parsed and before the body is read. An error that is (or wraps)
	// a *[Problem] is answered as that problem (e.g. a 401 whose
	// Problem.Header carries WWW-Authenticate); any other error gives 500
	// ProblemInternal.
	//
	// Scope is required. Left nil, the middleware does not fall back to one
	// key space shared by every client, where one client's key and body
	// replay another client's response. It answers every guarded request
	// 500 ProblemInternal without running the handler ([ErrNoScope]).
	//
	// Return the authenticated account. The authentication middleware
	// before this one sets it from a verified credential, never from a
	// header the client chooses. Or use [ClientCertScope]. Or say that the
	// service has a single tenant with [SharedScope].
	Scope func(*http.Request) (string, error)

	// Route returns the route part of the fingerprint. Defaults to
	// r.URL.RequestURI(): the path and the query string, so the same key on
	// another URL (?currency=EUR instead of USD) is refused with 422 rather
	// than replayed. Return r.URL.Path to leave the query out.
	Route func(*http.Request) string

	// FingerprintHeaders are request header fields whose values become part
	// of the fingerprint (e.g. "Stripe-Account" or "X-Currency"): the same
	// key with another value is refused with 422. Defaults to none.
	FingerprintHeaders []string

	// IgnoreFields are members of a JSON request body left out of the
	// fingerprint, as dot-separated paths from the top-level object
	// ("client_timestamp", "meta.trace_id"). A retry that changes only them
	// is replayed instead of refused. The handler still gets the body as
	// sent. Ignored for non-JSON bodies.
	IgnoreFields []string

	// Fingerprint, if set, replaces the fingerprint entirely: it gets the
	// request and its whole body, and returns any string; the middleware
	// hashes it, so its length does not matter. An error refuses the
	// request with 400 ProblemInvalidBody (or as the *[Problem] it
	// wraps). Route, FingerprintHeaders and IgnoreFields are then unused.
	Fingerprint func(r *http.Request, body []byte) (string, error)

	// MaxRequestBody is the largest request body accepted, in bytes; a
	// larger one is refused with 413 ProblemRequestTooLarge before
	// anything is stored. The body is held in memory to fingerprint it and
	// to hand it to the handler. Defaults to 1 MiB; a
	// negative value means no limit.
	MaxRequestBody int64

	// MaxResponseBody is the largest response body the handler may write,
	// in bytes; the response is buffered and stored. Past it the handler's
	// Write returns an error, its writes are rolled back, the key stays
	// free and the client gets 500 ProblemResponseTooLarge. Defaults to
	// 1 MiB; a negative value means no limit (the store
	// may still refuse a body larger than its column).
	MaxResponseBody int64

	// ReplayHeaders are the response header fields stored with the key and
	// replayed (compared case-insensitively). Set-Cookie and the hop-by-hop
	// fields (Connection and the fields it names, Keep-Alive, Proxy-*, TE,
	// Trailer, Transfer-Encoding, Upgrade) are never stored, even if listed;
	// neither are Content-Length (recomputed) and Date. Defaults to
	// Cache-Control, Content-Disposition, Content-Encoding,
	// Content-Language, Content-Location, Content-Type, ETag, Expires,
	// Last-Modified, Link, Location and Vary: the representation and
	// location fields a replay needs to mean what the first response meant.
	// A non-nil empty slice stores no header.
	ReplayHeaders []string

	// KeepStatus reports whether a response the handler wrote is stored with
	// the key and committed with the handler's writes. A status it refuses
	// is sent to the client as written, but the handler's writes are rolled
	// back and the key stays free. A retry with the same key runs the
	// handler again. It is never asked about 5xx, which are never stored.
	// Defaults to [DefaultKeepStatus] (2xx, 3xx and the outcome 4xx are stored;
	// 400, 401, 403, 404, 405, 408, 409, 413, 415, 422, 425, 429 and 431
	// are not).
	KeepStatus func(status int) bool

	// RenderProblem, if set, writes every error the middleware answers
	// itself, instead of the default application/problem+json document
	// ([WriteProblem]). p.Header holds the fields the answer must carry, and
	// the renderer must send them. They are Retry-After on 409 (or 425) and
	// 503, [HeaderKeyExpires] on the in-progress problem, the Link of
	// [Options].ProblemDocs, and whatever a Scope or ValidateKey problem set,
	// such as WWW-Authenticate.
	RenderProblem func(w http.ResponseWriter, r *http.Request, p *Problem)

	// EchoKey sends the request's key header back, as the client sent it,
	// on every answer once the header parses as a key: the handler's
	// answers, replays and problems alike, as Stripe's API does. Defaults
	// to false. With ExposeHeaders the field is exposed to browsers too.
	EchoKey bool

	// OnError, if set, is called with the cause of every 500 and 503 the
	// middleware answers itself (store failures included), for logging. It
	// is not called when the client went away (its request context was
	// cancelled).
	// A handler that wrote around the middleware ([ErrWriterBypassed]) is
	// reported once per [Middleware], with what to mount instead. The
	// refusals that follow are not reported (they are in [RequestEvent].Err).
	// Without OnError, that one report goes to the http.Server's ErrorLog
	// (or, as net/http does, to the log package's standard logger).
	OnError func(r *http.Request, err error)

	// Observer, if set, is told about every guarded request once it is
	// answered, refusals before the store is reached (400, 413) included;
	// see [RequestEvent]. It runs on the request's goroutine and must not block
	// for long.
	Observer func(ctx context.Context, ev RequestEvent)

	// TTL, if set, is how long the keys of the routes behind this
	// middleware are remembered after their answer was stored, instead of
	// the Guard's [idempotency.Config].TTL: a payment route may keep its
	// keys 72h while the rest keep 24h. [Middleware] applies it once, with
	// [idempotency.Guard.WithTTL]: the view shares the Guard's store and
	// in-memory queue. A TTL the Guard would refuse (negative, or under
	// 1ms) makes the middleware answer every guarded request 500
	// ProblemInternal; [Options.Validate] finds it at start-up.
	TTL time.Duration

	// ExposeHeaders adds Access-Control-Expose-Headers to every answer of
	// a guarded request, naming the fields the middleware sets that a
	// browser's script may read: [HeaderReplayed] and [HeaderKeyExpires]
	// on answers and replays, and on problems those of them it carries
	// plus Retry-After and Link. Names already listed (by a CORS
	// middleware before this one) are kept and not repeated. Defaults to
	// false: set it when browsers call the API across origins.
	ExposeHeaders bool

	// ProblemDocs, if set, is the URL of the service's documentation of
	// its idempotency errors: every problem the middleware answers itself
	// (400, 409 or 425, 413, 422, 500, 503) carries
	// Link: <ProblemDocs>; rel="describedby", as the draft's examples show.
	// An absolute http or https URL of printable ASCII without spaces,
	// quotes or angle brackets; [Options.Validate] refuses any other.
	ProblemDocs string

	// InProgressStatus is the status of the "in progress" answer (a
	// request whose key another request holds): 409 Conflict, the draft's
	// and the default, or 425 Too Early (RFC 8470) for services that keep
	// 409 for business conflicts. The problem ([ProblemInProgress]) and
	// its Retry-After are the same. Any other value is refused by
	// [Options.Validate] (and answered 500 ProblemInternal).
	InProgressStatus int

	// InProgress, if set, may answer a request whose key another request
	// holds, before the middleware answers InProgressStatus: for instance
	// from the resource the first request is creating, looked up by the
	// key. It returns true when it wrote the answer, false (having
	// written nothing) to leave it to the middleware. The handler did not run and nothing was stored.
	InProgress func(w http.ResponseWriter, r *http.Request, key idempotency.Key) bool

	// KeySchema describes, for [OpenAPI], the keys ValidateKey accepts. Nil
	// means: a UUID when ValidateKey is [UUIDKey], else 1 to 255 printable
	// ASCII bytes. It does not validate anything itself.
	KeySchema *KeySchema

	// Quota, if set, limits each scope's new keys per window, keys in
	// progress and bytes of stored answers. The counters are in the
	// Guard's store (its [backend.QuotaCounter]), so every instance
	// of the service shares them. Over a limit a request is refused with
	// 429 ProblemOverQuota and Retry-After, before anything is written;
	// a replay of a completed key is never refused nor counted. Each
	// request costs one statement of the store before the handler runs
	// and one after. See [idempotency.Quota] for the window's semantics.
	// [Options.Validate] checks it.
	Quota *idempotency.Quota
}
