package idemhttp

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// headerShouldRetry is the response field [WriteStripeError] sets to tell
// a Stripe SDK whether to retry: "true" on the answers that carry
// Retry-After (409 or 425 in progress, 503), "false" on every other.
// The SDKs read it before the status.
const headerShouldRetry = "Stripe-Should-Retry"

// stripeError is the member "error" of the body [WriteStripeError] writes:
// the error object of Stripe's API, which Stripe's SDKs (stripe-node,
// stripe-go, stripe-python...) turn into an exception.
type stripeError struct {
	// Type is the class of error: "invalid_request_error",
	// "idempotency_error", "rate_limit_error", "authentication_error",
	// "permission_error" or "api_error".
	Type string `json:"type"`
	// Code names the problem: see [WriteStripeError]. Empty for a
	// problem of the application's own ([Options].Scope, ValidateKey,
	// an operation's Validate) whose type this package does not define.
	Code string `json:"code,omitempty"`
	// Message is the problem's title and detail, for people.
	Message string `json:"message"`
	// DocURL is the problem's type URI when it is an http(s) URL: the
	// documentation of the problem.
	DocURL string `json:"doc_url,omitempty"`
}

// stripeCodes maps this package's problem types to Stripe's error type and
// code.
var stripeCodes = map[string][2]string{
	problemMissingKey:       {"invalid_request_error", "idempotency_key_missing"},
	problemInvalidKey:       {"invalid_request_error", "idempotency_key_invalid"},
	problemInvalidBody:      {"invalid_request_error", "invalid_body"},
	problemRequestTooLarge:  {"invalid_request_error", "request_too_large"},
	problemUnknownOperation: {"invalid_request_error", "resource_missing"},
	ProblemInProgress:       {"idempotency_error", "idempotency_key_in_use"},
	ProblemMismatch:         {"idempotency_error", "idempotency_key_reused"},
	problemOverQuota:        {"rate_limit_error", "rate_limit"},
	problemResponseTooLarge: {"api_error", "response_too_large"},
	problemNoResponse:       {"api_error", "no_response"},
	problemInternal:         {"api_error", "internal_error"},
	problemStoreUnavailable: {"api_error", "idempotency_store_unavailable"},
	problemUnfinished:       {"api_error", "operation_unfinished"},
}

// stripeErrorOf returns the Stripe error object [WriteStripeError] writes
// for p.
func stripeErrorOf(p *Problem) stripeError {
	e := stripeError{Message: p.Title}
	if p.Detail != "" {
		e.Message = strings.TrimSuffix(p.Title, ".") + ". " + p.Detail
	}
	if strings.HasPrefix(p.Type, "https://") || strings.HasPrefix(p.Type, "http://") {
		e.DocURL = p.Type
	}
	if tc, ok := stripeCodes[p.Type]; ok {
		e.Type, e.Code = tc[0], tc[1]
		return e
	}
	switch {
	case p.Status == http.StatusUnauthorized:
		e.Type = "authentication_error"
	case p.Status == http.StatusForbidden:
		e.Type = "permission_error"
	case p.Status == http.StatusTooManyRequests:
		e.Type = "rate_limit_error"
	case p.Status >= 500:
		e.Type = "api_error"
	default:
		e.Type = "invalid_request_error"
	}
	return e
}

// WriteStripeError answers p as Stripe's API answers its errors, for
// clients that read errors only in that shape (the official Stripe SDKs
// return any other answer, whatever its status, as a successful result).
// Set it as [Options].RenderProblem:
//
//	cfg.RenderProblem = idemhttp.WriteStripeError
//
// The status, p.Header (Retry-After, Idempotency-Key-Expires, Link,
// WWW-Authenticate...) and Cache-Control: no-store are sent as
// [WriteProblem] sends them; the body is application/json:
//
//	{"error":{"type":"idempotency_error","code":"idempotency_key_in_use","message":"...","doc_url":"..."}}
//
// with this type and code for each problem:
//
//	400 ProblemMissingKey        invalid_request_error  idempotency_key_missing
//	400 ProblemInvalidKey        invalid_request_error  idempotency_key_invalid
//	400 ProblemInvalidBody       invalid_request_error  invalid_body
//	404 ProblemUnknownOperation  invalid_request_error  resource_missing
//	409 ProblemInProgress        idempotency_error      idempotency_key_in_use (425 too)
//	413 ProblemRequestTooLarge   invalid_request_error  request_too_large
//	422 ProblemKeyReused         idempotency_error      idempotency_key_reused
//	429 ProblemOverQuota         rate_limit_error       rate_limit
//	500 ProblemResponseTooLarge  api_error              response_too_large
//	500 ProblemNoResponse        api_error              no_response
//	500 ProblemInternal          api_error              internal_error
//	503 ProblemStoreUnavailable  api_error              idempotency_store_unavailable
//	503 ProblemUnfinished        api_error              operation_unfinished
//
// A problem of another type (one a Scope or ValidateKey returned) gets
// authentication_error for 401, permission_error for 403,
// rate_limit_error for 429, api_error for 5xx and invalid_request_error
// otherwise, and no code.
//
// It also sets Stripe-Should-Retry, which the SDKs obey before their own
// rules (they retry 409 and 5xx): "true" when p carries Retry-After and is
// not a 429, so that an SDK retries the in-progress answer (409 or 425)
// and the 503s; "false" otherwise, so that it does not repeat a 500 no
// retry cures. The SDKs do not wait for Retry-After: see docs/http-client.md for
// what to configure.
func WriteStripeError(w http.ResponseWriter, _ *http.Request, p *Problem) {
	body, err := json.Marshal(struct {
		Error stripeError `json:"error"`
	}{stripeErrorOf(p)})
	if err != nil { // a stripeError always marshals; keep the status anyway
		body = []byte(`{"error":{"type":"api_error","message":"error"}}`)
	}
	h := w.Header()
	for k, v := range p.Header {
		h[http.CanonicalHeaderKey(k)] = v
	}
	retry := p.Header.Get("Retry-After") != "" && p.Status != http.StatusTooManyRequests
	h.Set(headerShouldRetry, strconv.FormatBool(retry))
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// echoKey sets the key header, as the client sent it, on every answer
// to come ([Options].EchoKey), and exposes it to browsers with
// [Options].ExposeHeaders.
func (h *handler[Tx]) echoKey(w http.ResponseWriter, value string) {
	w.Header().Set(h.c.header, value)
	if h.c.expose {
		expose(w.Header(), h.c.header)
	}
}
