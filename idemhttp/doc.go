// Package idemhttp puts an [idempotency.Guard] in front of net/http handlers
// and gives clients a retrying [Client] that keeps one key per operation,
// following the IETF draft "The Idempotency-Key HTTP Header Field".
//
// # Server
//
// [Middleware] reads the Idempotency-Key header on POST and PATCH requests
// (configurable), fingerprints the request (method, route and body, JSON
// bodies canonicalized), and runs the handler inside [idempotency.Guard.Do].
// The handler takes the store's open transaction from the request context
// with [TxFrom] and does its writes through it, so the writes, the key and
// the stored response commit together or not at all:
//
//	mw := idemhttp.Middleware(guard, nil)
//	mux.Handle("POST /payments", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		tx, ok := idemhttp.TxFrom[*sql.Tx](r.Context())
//		...
//	})))
//
// The handler writes to a buffer. When it returns:
//
//   - a status below 500 (and not transient, see [Options].Transient) is
//     stored with the key and committed with the handler's writes, then sent
//     to the client exactly as the handler wrote it;
//   - a 5xx or transient status rolls back the handler's writes and frees the
//     key (a retry runs the handler again); the response still goes to the
//     client as written;
//   - a panic rolls back and is re-raised, for net/http to recover.
//
// The buffering writer supports http.ResponseController's read and write
// deadlines but not Flush or Hijack: streaming responses, 1xx informational
// responses (dropped) and trailers are not supported behind the middleware.
//
// A later request with the same key and the same fingerprint gets the stored
// status, the stored headers that pass the allowlist ([Options].ReplayHeaders;
// never Set-Cookie, never hop-by-hop fields), the body byte-exact and the
// header "Idempotent-Replayed: true", without running the handler. The same
// key with another request is refused with 422.
//
// Keys are scoped by [Options].Scope. The default is the empty scope: every
// client shares one key space, so one client's key could replay another
// client's response. A multi-tenant service must set Scope, typically to the
// authenticated account.
//
// # Problems
//
// Every error the middleware writes itself is an RFC 9457
// application/problem+json document ([Problem]) whose type is one of the
// Problem* constants of this package (each URI links to its documentation):
//
//	status  type                     when
//	400     ProblemMissingKey        no Idempotency-Key on a method that requires one
//	400     ProblemInvalidKey        the key is not a valid sf-string / not 1..255 printable ASCII, or appears twice
//	400     ProblemInvalidBody       a JSON content type with a body that is not one valid JSON value, or an unreadable body
//	409     ProblemInProgress        a request with the same key is still running (sent with Retry-After)
//	413     ProblemRequestTooLarge   the request body exceeds Options.MaxRequestBody
//	422     ProblemKeyReused         the key was used with another request (method, route or body)
//	500     ProblemResponseTooLarge  the handler's response body exceeded Options.MaxResponseBody; its writes were rolled back
//	500     ProblemInternal          misconfiguration (nil guard, failing Scope, invalid scope, invalid status)
//	503     ProblemStoreUnavailable  the key store failed; the handler did not run or was rolled back (sent with Retry-After)
//
// # Client
//
// [Client] gives each logical request one key, generated before the first
// attempt (or the caller's own Idempotency-Key), and retries network
// errors, 409, 429 and 5xx with exponential backoff and full jitter,
// honouring Retry-After, always with the same key and body.
package idemhttp
