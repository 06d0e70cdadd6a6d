package idemhttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// problemBase prefixes every problem type URI; the name that follows it
// is listed in the documentation of [Problem].
const problemBase = "https://pkg.go.dev/github.com/go-idempotency/idempotency/idemhttp#"

// The problem types a client branches on; [Problem] lists every type.
const (
	// ProblemInProgress is the type of the 409 (or 425) answer to a request
	// whose key another request holds: retry later with the same key, after
	// its Retry-After. [Transport] retries this problem type.
	ProblemInProgress = problemBase + "ProblemInProgress"
	// ProblemMismatch is the type of the 422 answer to a key already used
	// with another request (another method, route or body): the condition
	// of [idempotency.ErrMismatch]. The handler did not run; retrying with
	// the same key cannot succeed. Its URI keeps the name it had before
	// v0.2, ProblemKeyReused, as clients match on it.
	ProblemMismatch = problemBase + "ProblemKeyReused"
)

// The other problem types; [Problem] documents them.
const (
	problemMissingKey       = problemBase + "ProblemMissingKey"
	problemInvalidKey       = problemBase + "ProblemInvalidKey"
	problemInvalidBody      = problemBase + "ProblemInvalidBody"
	problemRequestTooLarge  = problemBase + "ProblemRequestTooLarge"
	problemOverQuota        = problemBase + "ProblemOverQuota"
	problemResponseTooLarge = problemBase + "ProblemResponseTooLarge"
	problemNoResponse       = problemBase + "ProblemNoResponse"
	problemInternal         = problemBase + "ProblemInternal"
	problemStoreUnavailable = problemBase + "ProblemStoreUnavailable"
)

// problemContentType is the media type of problem details (RFC 9457).
const problemContentType = "application/problem+json"

// Problem is an RFC 9457 problem details object, sent as
// application/problem+json. The middleware writes one for every error it
// answers itself; a [Options].Scope or [Options].ValidateKey function may
// return one (as error) to choose the answer, e.g. a 401 with a
// WWW-Authenticate header.
//
// The problem types this package answers are stable across versions: each
// is the URI https://pkg.go.dev/github.com/go-idempotency/idempotency/idemhttp#
// followed by its name below. Clients match on the URI; Go code may use
// the constants [ProblemInProgress] and [ProblemMismatch], the two a client
// must tell apart from another answer of the same status.
//
//	status  name                     when
//	400     ProblemMissingKey        the method requires a key header and the request has none
//	400     ProblemInvalidKey        the key is not a valid sf-string or bare key of 1 to 255 printable
//	                                 ASCII bytes, the header appears twice, or Options.ValidateKey refused it
//	400     ProblemInvalidBody       a JSON content type with a body that is not exactly one valid JSON
//	                                 value (duplicate object keys included), a form body net/url refuses
//	                                 (idempotency.ErrInvalidBody), an unreadable body, or an input an
//	                                 operation's Validate refused
//	404     ProblemUnknownOperation  the status resource of [AsyncStatus] names no operation of the
//	                                 caller's scope (none started with that key, or its answer expired)
//	409     ProblemInProgress        a request with the same key is still running ([ProblemInProgress];
//	                                 425 with Options.InProgressStatus), with Retry-After
//	413     ProblemRequestTooLarge   the request body exceeds Options.MaxRequestBody
//	422     ProblemKeyReused         the key was used with another request ([ProblemMismatch])
//	429     ProblemOverQuota         the scope reached a limit of Options.Quota; retry the unused key
//	                                 after Retry-After (the end of the quota's window)
//	500     ProblemResponseTooLarge  the handler's body exceeded Options.MaxResponseBody ([ErrResponseTooLarge])
//	500     ProblemNoResponse        the handler wrote nothing ([ErrNoResponse])
//	500     ProblemInternal          misconfiguration ([ErrNoScope]; a nil Guard; Scope failed or returned
//	                                 an invalid scope; an invalid status; [ErrWriterBypassed], then
//	                                 [ErrBypassRefused]), or the store's table is missing or out of date
//	                                 (idempotency.ErrSchema, sent without Retry-After)
//	503     ProblemStoreUnavailable  the key store failed or is busy (idempotency.ErrStore), with Retry-After
//	503     ProblemUnfinished        an operation's step failed transiently ([Operation]), with Retry-After:
//	                                 a retry with the same key, or the Completer, resumes it
type Problem struct {
	// Type is a URI identifying the problem type.
	Type string `json:"type"`
	// Title is a short, human-readable summary of the problem type.
	Title string `json:"title"`
	// Status is the HTTP status code.
	Status int `json:"status"`
	// Detail explains this occurrence.
	Detail string `json:"detail,omitempty"`
	// Header holds response header fields sent with the problem, such as
	// WWW-Authenticate on a 401 or Retry-After on a 409; not part of the
	// JSON document.
	Header http.Header `json:"-"`
}

// Error returns the title, the status and the detail.
func (p *Problem) Error() string {
	if p.Detail == "" {
		return fmt.Sprintf("%s (%d)", p.Title, p.Status)
	}
	return fmt.Sprintf("%s (%d): %s", p.Title, p.Status, p.Detail)
}

// WriteProblem answers p as an application/problem+json document with
// Cache-Control: no-store, plus the fields of p.Header. It is the default
// [Options].RenderProblem; a custom renderer may call it after changing p.
func WriteProblem(w http.ResponseWriter, p *Problem) {
	body, err := json.Marshal(p)
	if err != nil { // a Problem always marshals; keep the status anyway
		body = []byte(`{"status":` + strconv.Itoa(p.Status) + `}`)
	}
	h := w.Header()
	for k, v := range p.Header {
		h[http.CanonicalHeaderKey(k)] = v
	}
	h.Set("Content-Type", problemContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}
