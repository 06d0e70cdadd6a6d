// Package idemhttp puts an [idempotency.Guard] in front of net/http
// handlers. It also gives clients a retrying [Transport] that keeps one key
// per operation. Both follow the IETF draft "The Idempotency-Key HTTP
// Header Field".
//
// # Server
//
// [Middleware] reads the Idempotency-Key header on POST and PATCH requests
// (configurable). It fingerprints the request: method, route and body, JSON
// and form (application/x-www-form-urlencoded) bodies canonicalized. Then
// it runs the handler inside [idempotency.Guard.Do]. The handler takes the
// store's open transaction from the request context with [idempotency.TxFrom], and does
// its writes through it. So the writes, the key and the stored response
// commit together or not at all:
//
//	mw := idemhttp.Middleware(guard, &idemhttp.Options{
//		// The authenticated account, set by the authentication middleware.
//		Scope: func(r *http.Request) (string, error) { return accountID(r), nil },
//	})
//	mux.Handle("POST /payments", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		tx, ok := idempotency.TxFrom[*sql.Tx](r.Context())
//		...
//	})))
//
// The handler writes to a buffer. When it returns:
//
//   - A status that [Options].KeepStatus accepts is stored with the key and
//     committed with the handler's writes. It is then sent to the client
//     exactly as the handler wrote it. [DefaultKeepStatus] accepts 2xx, 3xx and
//     the 4xx that are the operation's outcome, such as 402.
//   - Any other status rolls back the handler's writes and frees the key: a
//     retry runs the handler again. The response still goes to the client as
//     written. These are every 5xx; 408, 409, 425, 429; and the
//     request-validation and access failures 400, 401, 403, 404, 405, 413,
//     415, 422, 431. Only an outcome is stored, one that commits with the
//     operation's writes. A 5xx rolls back with them, so there is nothing
//     for a replay to stand for, and a retry runs the operation once
//     (Stripe, whose effects may not roll back, stores and replays its
//     5xx; this package does not). A request that failed validation or
//     conflicted with another is not saved, as at Stripe: storing a 400
//     would replay it for the key's whole TTL after the client fixed its
//     request.
//   - A handler that wrote nothing at all (no WriteHeader, no Write) is
//     rolled back and answered 500 ProblemNoResponse. An answer the
//     handler did not write is never stored ([ErrNoResponse]). This is what
//     a framework adapter that bypasses the middleware's writer produces.
//     gin, echo and fiber have their own packages (idemgin, idemecho,
//     idemfiber, nested modules); chi and http.ServeMux need none.
//   - A handler may write around the writer the middleware passed, to the
//     ResponseWriter the middleware was given. (gin's c.Writer does, under
//     the usual adapter c.Request = r; c.Next().) It is rolled back, stores
//     nothing, and is reported loudly once ([ErrWriterBypassed]). An answer
//     that already went out cannot be taken back. So from then on that
//     [Middleware] answers every guarded request 500 ProblemInternal
//     without running the handler ([ErrBypassRefused]).
//   - A panic rolls back and is re-raised, for net/http to recover.
//
// The buffering writer supports http.ResponseController's read and write
// deadlines, but not Flush or Hijack. Streaming responses, 1xx
// informational responses (dropped) and trailers are not supported behind
// the middleware.
//
// Fields of [Options] change the key header ([Options].KeyHeader, e.g.
// X-Idempotency-Key). They validate keys ([Options].ValidateKey, [UUIDKey],
// [MinKeyLength]) and render problems ([Options].RenderProblem). They shape
// the fingerprint ([Options].FingerprintHeaders, [Options].IgnoreFields,
// [Options].Fingerprint). They observe every guarded request, refusals
// included ([Options].Observer, [RequestEvent], [observe.Outcome]).
//
// A later request with the same key and the same fingerprint does not run
// the handler. It gets the stored status and the body byte-exact, with the
// header "Idempotent-Replayed: true". It gets the stored headers that pass
// the allowlist ([Options].ReplayHeaders; never Set-Cookie, never
// hop-by-hop fields). The same key with another request is refused with
// 422.
//
// Keys are scoped by [Options].Scope, which is required: the same key in two
// scopes never meets. There is no shared default, where one client's key
// and body would replay another client's response. A middleware mounted
// without Scope answers every guarded request 500 ProblemInternal and runs
// nothing ([ErrNoScope]; [Options.Validate] finds it at start-up). Scope by
// the authenticated account, or by the verified client certificate
// ([ClientCertScope]). A service with a single tenant shares one key space
// on purpose with [SharedScope].
//
// # Problems
//
// Every error the middleware writes itself is an RFC 9457
// application/problem+json document ([Problem]). Its type is one of the
// URIs that [Problem] lists, by name: [ProblemInProgress] and [ProblemMismatch] are
// constants, the types a client branches on.
//
//	status  type                     when
//	400     ProblemMissingKey        no Idempotency-Key on a method that requires one
//	400     ProblemInvalidKey        the key is not a valid sf-string / not 1..255 printable ASCII, or appears twice
//	400     ProblemInvalidBody       a JSON content type with a body that is not one valid JSON value, a form body net/url refuses, or an unreadable body
//	409     ProblemInProgress        a request with the same key is still running (sent with Retry-After and
//	                                 Idempotency-Key-Expires); 425 with Options.InProgressStatus
//	413     ProblemRequestTooLarge   the request body exceeds Options.MaxRequestBody
//	422     ProblemKeyReused         the key was used with another request (method, route or body): ProblemMismatch
//	500     ProblemResponseTooLarge  the handler's response body exceeded Options.MaxResponseBody; its writes were rolled back
//	500     ProblemNoResponse        the handler wrote nothing; its writes were rolled back
//	500     ProblemInternal          misconfiguration (no Scope: every guarded request; nil guard, failing Scope, invalid
//	                                 scope, invalid status, the handler wrote around the middleware: then every later
//	                                 request, before the handler runs; the store's table missing or out of date:
//	                                 idempotency.ErrSchema, no Retry-After)
//	503     ProblemStoreUnavailable  the key store failed (idempotency.ErrStore: cut connection, timeout, database
//	                                 busy with another writer); the handler did not run or was rolled back (sent with Retry-After)
//
// With [Options].ProblemDocs set, every problem carries
// Link: <ProblemDocs>; rel="describedby".
//
// # Operations
//
// [Operation] serves an [idempotency.Operation] of several steps within
// the request: the operation's Validate refuses a bad body (400, nothing
// stored, so the corrected body runs with the same key), and a step's
// transient failure is 503 ProblemUnfinished. [Async] answers 202
// Accepted when the operation outlives [AsyncOptions].Wait, with a Location
// whose id seals the key under [AsyncOptions].Secrets; [AsyncStatus] serves
// it. They refuse a bad configuration when they are built.
//
// # Key lifetime
//
// The first answer stored with a key and every replay carry
// [HeaderKeyExpires]: until when the key keeps the answer (see its
// documentation for the in-progress problem's lower bound). [Options].TTL
// gives a route its own lifetime through [idempotency.Guard.WithTTL];
// [Options].ExposeHeaders lets browsers read the fields; [OpenAPI] describes
// the whole contract for an OpenAPI 3.1 document.
//
// # Client
//
// [Transport] is an http.RoundTripper for any http.Client. It gives each
// logical request one key, generated before the first attempt (or the
// caller's own key header). It retries what [DefaultRetry] (or
// [Transport].Retry) allows, always with the same key and body:
//
//   - transport errors;
//   - 5xx except 501 and 505;
//   - 429;
//   - a 409 (or 425) only when it is the server's in-progress answer
//     ([ProblemInProgress] or Retry-After), never a business 409.
//
// It stops, with [ErrKeyExpired], when the next attempt would arrive
// after the key's expiry ([HeaderKeyExpires]).
//
// It waits with exponential backoff and full jitter, honouring
// Retry-After. [Transport].OnRetry is told about each retry. A shared
// [RetryBudget] bounds retries across calls.
package idemhttp
