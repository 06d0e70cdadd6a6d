package idemhttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// problemBase prefixes every problem type: the URIs resolve to the
// documentation of the constants below.
const problemBase = "https://pkg.go.dev/github.com/go-idempotency/idempotency/idemhttp#"

// Problem types written by [Middleware], stable across versions. Each is a
// URI that resolves to its own documentation.
const (
	// ProblemMissingKey (400): the method requires an Idempotency-Key
	// header and the request has none. Nothing was stored.
	ProblemMissingKey = problemBase + "ProblemMissingKey"
	// ProblemInvalidKey (400): the Idempotency-Key header is not a valid
	// sf-string or bare key of 1 to 255 printable ASCII bytes, it was sent
	// more than once, or [Config].ValidateKey refused it. Nothing was
	// stored.
	ProblemInvalidKey = problemBase + "ProblemInvalidKey"
	// ProblemInvalidBody (400): the request has a JSON content type and its
	// body is not exactly one valid JSON value (duplicate object keys
	// included), or the form content type and a body net/url refuses
	// ([idempotency.ErrInvalidBody]), or the body could not be read.
	// Nothing was stored.
	ProblemInvalidBody = problemBase + "ProblemInvalidBody"
	// ProblemInProgress (409): a request with the same key is still being
	// processed. Retry later with the same key (the response carries
	// Retry-After). [Transport] retries this problem type.
	ProblemInProgress = problemBase + "ProblemInProgress"
	// ProblemRequestTooLarge (413): the request body is larger than
	// [Config].MaxRequestBody. Nothing was stored.
	ProblemRequestTooLarge = problemBase + "ProblemRequestTooLarge"
	// ProblemKeyReused (422): the key was already used with another
	// request (another method, route or body). The handler did not run.
	ProblemKeyReused = problemBase + "ProblemKeyReused"
	// ProblemOverQuota (429): the client's scope reached a limit of
	// [Config].Quota (new keys or stored bytes in the window, or requests
	// in progress). Nothing was processed nor stored, and the key stays
	// unused: retry it after the delay in Retry-After (the end of the
	// quota's window).
	ProblemOverQuota = problemBase + "ProblemOverQuota"
	// ProblemResponseTooLarge (500): the handler wrote a response body
	// larger than [Config].MaxResponseBody. Its writes were rolled back
	// and the key is free.
	ProblemResponseTooLarge = problemBase + "ProblemResponseTooLarge"
	// ProblemNoResponse (500): the handler returned without writing a
	// status or a body ([ErrNoResponse]). Its writes were rolled back and
	// the key is free: an empty answer is never stored.
	ProblemNoResponse = problemBase + "ProblemNoResponse"
	// ProblemInternal (500): the middleware is misconfigured (no Scope:
	// [ErrNoScope]; nil guard; Scope failed or returned an invalid scope;
	// the handler wrote an invalid status; or it is mounted so that the handler writes around
	// it: [ErrWriterBypassed], then [ErrBypassRefused] for every later
	// request), or the store's table is missing or out of date
	// ([idempotency.ErrSchema]: sent without Retry-After, since no retry
	// helps until the table is migrated). The handler's writes, if any,
	// were rolled back.
	ProblemInternal = problemBase + "ProblemInternal"
	// ProblemStoreUnavailable (503): the key store failed
	// ([idempotency.ErrStore]: connection cut, timeout, a database busy
	// with another writer, conflicts past the retries). The middleware
	// fails closed: the handler did not run, or its writes were rolled
	// back. Retrying with the same key is safe (the response carries
	// Retry-After).
	ProblemStoreUnavailable = problemBase + "ProblemStoreUnavailable"
)

// ProblemContentType is the media type of problem details (RFC 9457).
const ProblemContentType = "application/problem+json"

// Problem is an RFC 9457 problem details object. The middleware writes one
// for every error it answers itself; a [Config].Scope or
// [Config].ValidateKey function may return one (as error) to choose the
// answer, e.g. a 401 with a WWW-Authenticate header.
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
// [Config].RenderProblem; a custom renderer may call it after changing p.
func WriteProblem(w http.ResponseWriter, p *Problem) {
	body, err := json.Marshal(p)
	if err != nil { // a Problem always marshals; keep the status anyway
		body = []byte(`{"status":` + strconv.Itoa(p.Status) + `}`)
	}
	h := w.Header()
	for k, v := range p.Header {
		h[http.CanonicalHeaderKey(k)] = v
	}
	h.Set("Content-Type", ProblemContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}
