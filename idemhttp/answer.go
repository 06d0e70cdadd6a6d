package idemhttp

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/observe"
)

// problem answers p through the renderer and records in ev the status
// the renderer wrote, which may not be p.Status (a renderer that maps 422
// to 409). A renderer that wrote no status would let the server send an
// empty 200 for an error: the middleware answers p with [WriteProblem].
//
// The problem goes out with the fields the configuration adds: the Link
// to [Options].ProblemDocs and, with [Options].ExposeHeaders, the
// Access-Control-Expose-Headers naming what a browser may read. p itself
// (which may be the caller's, from Scope or ValidateKey) is not changed.
func (h *handler[Tx]) problem(w http.ResponseWriter, r *http.Request, ev *RequestEvent, p *Problem) {
	if h.c.link != "" || h.c.expose {
		cp := *p
		cp.Header = p.Header.Clone()
		if cp.Header == nil {
			cp.Header = http.Header{}
		}
		if h.c.link != "" {
			cp.Header.Add("Link", h.c.link)
		}
		if h.c.expose {
			var names []string
			for _, n := range []string{HeaderKeyExpires, "Retry-After", "Link"} {
				if _, ok := cp.Header[n]; ok {
					names = append(names, n)
				}
			}
			expose(w.Header(), names...)
		}
		p = &cp
	}
	sw := &statusWriter{ResponseWriter: w}
	h.c.render(sw, r, p)
	if sw.status == 0 {
		WriteProblem(sw, p)
	}
	ev.Status = sw.status
}

// statusWriter records the status written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

// WriteHeader records the first final status and passes code on.
func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && (code < 100 || code > 199 || code == http.StatusSwitchingProtocols) {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

// Write records the implicit 200 of a write without a status.
func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the writer underneath.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// refuseInvalid answers a guarded request of a middleware mounted with a
// [Options] field out of range: nothing ran, nothing was stored.
func (h *handler[Tx]) refuseInvalid(w http.ResponseWriter, r *http.Request, ev *RequestEvent) {
	ev.Outcome, ev.Err = observe.Internal, h.c.invalid
	h.warnOnce(&h.st.invalid, r, h.c.invalid)
	h.problem(w, r, ev, &Problem{Type: problemInternal, Title: "Idempotency middleware failed", Status: http.StatusInternalServerError,
		Detail: "The idempotency middleware is misconfigured; the request was not processed."})
}

// refuseNoScope answers a guarded request of a middleware mounted without
// [Options].Scope: nothing ran, nothing was stored.
func (h *handler[Tx]) refuseNoScope(w http.ResponseWriter, r *http.Request, ev *RequestEvent) {
	ev.Outcome, ev.Err = observe.Internal, ErrNoScope
	h.warnOnce(&h.st.noScope, r, ErrNoScope)
	h.problem(w, r, ev, &Problem{Type: problemInternal, Title: "Idempotency middleware failed", Status: http.StatusInternalServerError,
		Detail: "The idempotency middleware is mounted without a key scope; the request was not processed."})
}

// reject answers a refusal that happened before the store was reached.
func (h *handler[Tx]) reject(w http.ResponseWriter, r *http.Request, ev *RequestEvent, p *Problem, cause error) {
	ev.Outcome, ev.Err = observe.Rejected, cause
	if cause == nil {
		ev.Err = p
	}
	h.problem(w, r, ev, p)
}

// invalidKey answers 400 ProblemInvalidKey (or the *Problem err wraps);
// err wraps idempotency.ErrInvalidKey.
func (h *handler[Tx]) invalidKey(w http.ResponseWriter, r *http.Request, ev *RequestEvent, err error) {
	if p, ok := errors.AsType[*Problem](err); ok {
		h.reject(w, r, ev, p, err)
		return
	}
	reason := strings.TrimPrefix(err.Error(), idempotency.ErrInvalidKey.Error()+": ")
	h.reject(w, r, ev, &Problem{Type: problemInvalidKey, Title: h.c.header + " is invalid", Status: http.StatusBadRequest,
		Detail: reason + "; send 1 to 255 printable ASCII characters, bare or as a quoted sf-string."}, err)
}

// internal answers 500 ProblemInternal for a misconfiguration.
func (h *handler[Tx]) internal(w http.ResponseWriter, r *http.Request, ev *RequestEvent, err error) {
	ev.Outcome, ev.Err = observe.Internal, err
	if h.c.onError != nil {
		h.c.onError(r, err)
	}
	h.problem(w, r, ev, &Problem{Type: problemInternal, Title: "Idempotency middleware failed", Status: http.StatusInternalServerError})
}

// fail answers an error returned by Guard.Do; arrived is when the request
// reached the middleware, before Do.
func (h *handler[Tx]) fail(w http.ResponseWriter, r *http.Request, ev *RequestEvent, err error, arrived time.Time) {
	ev.Err = err
	if f, ok := errors.AsType[*handlerFailure](err); ok {
		// The handler's own response, rolled back and not stored.
		ev.Outcome, ev.Status = observe.NotStored, f.c.status
		if f.c.status >= 500 {
			ev.Outcome = observe.HandlerError
		} else {
			ev.Err = nil
		}
		writeResponse(w, f.c.status, f.c.sent, f.c.body.Bytes(), false, nil)
		return
	}
	if h.quotaFail(w, r, ev, err) { // 429 or a quota that cannot be checked
		return
	}
	switch {
	case errors.Is(err, ErrBypassRefused):
		h.refuseBypassed(w, r, ev)
		return
	case errors.Is(err, idempotency.ErrInvalidInput): // Operation.Validate: nothing stored
		h.invalidInput(w, r, ev, err)
		return
	case errors.Is(err, idempotency.ErrMismatch):
		ev.Outcome = observe.Mismatch
		h.problem(w, r, ev, &Problem{Type: ProblemMismatch, Title: h.c.header + " is already used", Status: http.StatusUnprocessableEntity,
			Detail: "This key was used with a different request (method, route or body); use a new key for a new request."})
		return
	case errors.Is(err, idempotency.ErrInProgress) && !errors.Is(err, idempotency.ErrStore):
		// Only a key that is truly held is "in progress": a store that is
		// busy (SQLite's writer held by another key not waiting) is a 503.
		// The holder answers after this request arrived: its answer is
		// kept at least the TTL from then (if it holds the key on this
		// route's TTL), a lower bound of the key's expiry.
		ev.Outcome = observe.InProgress
		if h.c.onHeld != nil {
			sw := &statusWriter{ResponseWriter: w}
			if h.c.onHeld(sw, r, ev.Key) {
				ev.Status = sw.status
				return
			}
		}
		hd := retryAfterHeader()
		if h.g != nil {
			hd.Set(HeaderKeyExpires, formatExpiry(backend.Expiry(arrived, h.g.TTL())))
		}
		h.problem(w, r, ev, &Problem{Type: ProblemInProgress, Title: "A request with this " + h.c.header + " is in progress", Status: h.c.progress,
			Detail: "Retry later with the same key to get its response.", Header: hd})
		return
	}
	canceled := errors.Is(err, context.Canceled) && r.Context().Err() != nil
	if h.c.onError != nil && !canceled {
		h.c.onError(r, err) // not for a client that went away
	}
	switch {
	case errors.Is(err, ErrNoResponse):
		ev.Outcome = observe.HandlerError
		h.problem(w, r, ev, &Problem{Type: problemNoResponse, Title: "The handler wrote no response", Status: http.StatusInternalServerError,
			Detail: "The operation was rolled back; retry with the same key."})
	case errors.Is(err, errResponseTooLarge):
		ev.Outcome = observe.HandlerError
		h.problem(w, r, ev, &Problem{Type: problemResponseTooLarge, Title: "Response too large to store", Status: http.StatusInternalServerError,
			Detail: "The response was larger than the idempotency store accepts; the operation was rolled back."})
	case errors.Is(err, idempotency.ErrUnfinished): // an operation's step failed: a retry resumes it
		ev.Outcome = observe.Unfinished
		h.problem(w, r, ev, &Problem{Type: problemUnfinished, Title: "The operation did not finish", Status: http.StatusServiceUnavailable,
			Detail: unfinishedDetail, Header: retryAfterHeader()})
	case errors.Is(err, idempotency.ErrInvalidResponse), errors.Is(err, idempotency.ErrInvalidKey), errors.Is(err, idempotency.ErrInvalidFingerprint),
		errors.Is(err, idempotency.ErrInvalidConfig):
		ev.Outcome = observe.Internal
		h.problem(w, r, ev, &Problem{Type: problemInternal, Title: "Idempotency middleware failed", Status: http.StatusInternalServerError})
	case errors.Is(err, idempotency.ErrSchema):
		// The store's table is missing or out of date: no retry cures it,
		// so no 503 and no Retry-After. OnError has the table's name.
		ev.Outcome = observe.Internal
		h.problem(w, r, ev, &Problem{Type: problemInternal, Title: "Idempotency middleware failed", Status: http.StatusInternalServerError,
			Detail: "The idempotency store is not set up for this service (its schema is missing or out of date); nothing was applied."})
	default:
		// idempotency.ErrStore (connection cut, timeout, busy database,
		// conflicts past the retries) and any other store error: fail closed.
		ev.Outcome = observe.StoreError
		if canceled {
			ev.Outcome = observe.Canceled
		}
		h.problem(w, r, ev, &Problem{Type: problemStoreUnavailable, Title: "Idempotency store busy or unavailable", Status: http.StatusServiceUnavailable,
			Detail: storeDetail, Header: retryAfterHeader()})
	}
}

// storeDetail is the detail of a 503: it says what the client knows (the
// store failed or was busy, nothing was applied) and what to do.
const storeDetail = "The idempotency key store is busy or unavailable. This request was not processed, " +
	"or its effects were rolled back; retry it later with the same key."

// retryAfterHeader is the header of a 409 in progress and of a 503.
func retryAfterHeader() http.Header { return http.Header{"Retry-After": {"1"}} }
