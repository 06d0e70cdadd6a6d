package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/observe"
)

// quotaEndTimeout bounds the statement that ends a request's admission. It
// runs even when the client went away (the count must come down), so it
// has a bound of its own.
const quotaEndTimeout = 5 * time.Second

// quotaSetupError: the quota cannot be checked at all (an invalid
// [Options].Quota, or a store without [backend.QuotaCounter]); the
// request is refused with 500 rather than run without its quota.
type quotaSetupError struct{ err error }

func (e *quotaSetupError) Error() string {
	return "idemhttp: Options.Quota cannot be checked: " + e.err.Error()
}
func (e *quotaSetupError) Unwrap() error { return e.err }

// do runs fn through the Guard, inside the scope's quota when one is
// configured: one statement of the store admits the key before Do takes
// its connection, another ends the admission after Do returned. A key
// refused by the quota gives an error wrapping
// [idempotency.ErrOverQuota]; nothing was written.
func (h *handler[Tx]) do(r *http.Request, key idempotency.Key, fp string, fn func(Tx) (idempotency.Response, error)) (idempotency.Response, observe.Event, error) {
	ctx, q := r.Context(), h.c.quota
	if q == nil {
		return h.g.DoEvent(ctx, key, fp, fn)
	}
	adm, err := h.g.AdmitQuota(ctx, key, q)
	switch {
	case errors.Is(err, idempotency.ErrInvalidConfig), errors.Is(err, errors.ErrUnsupported):
		return idempotency.Response{}, observe.Event{}, &quotaSetupError{err: err}
	case err != nil:
		return idempotency.Response{}, observe.Event{}, err
	}
	resp, gev, err := h.g.DoEvent(ctx, key, fp, fn)
	if adm.Counted {
		created := err == nil && !resp.Replayed
		var size int64
		if created {
			size = int64(len(resp.Body))
		}
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), quotaEndTimeout)
		eerr := h.g.EndQuota(ectx, key, q, adm, created, size)
		cancel()
		if eerr != nil && h.c.onError != nil {
			// The answer stands; the scope's window counts this request
			// in flight (and as a new key) until the window ends.
			h.c.onError(r, fmt.Errorf("idemhttp: ending the quota admission: %w", eerr))
		}
	}
	return resp, gev, err
}

// quotaFail answers a request whose quota refused it (429
// ProblemOverQuota with Retry-After) or could not be checked (500
// ProblemInternal). It reports whether err was one of those.
func (h *handler[Tx]) quotaFail(w http.ResponseWriter, r *http.Request, ev *RequestEvent, err error) bool {
	if se, ok := errors.AsType[*quotaSetupError](err); ok {
		if h.c.onError != nil {
			h.c.onError(r, se)
		}
		ev.Outcome = observe.Internal
		h.problem(w, r, ev, &Problem{Type: problemInternal, Title: "Idempotency middleware failed", Status: http.StatusInternalServerError})
		return true
	}
	qe, ok := errors.AsType[*idempotency.QuotaError](err)
	if !ok {
		return false
	}
	ev.Outcome, ev.QuotaLimit = observe.OverQuota, qe.Limit
	secs := int64((qe.RetryAfter + time.Second - 1) / time.Second)
	h.problem(w, r, ev, &Problem{Type: problemOverQuota, Title: "Quota exceeded", Status: http.StatusTooManyRequests,
		Detail: quotaDetail(h.c.quota, qe.Limit, secs), Header: http.Header{"Retry-After": {strconv.FormatInt(max(1, secs), 10)}}})
	return true
}

// quotaDetail says which limit was reached and when the window ends.
func quotaDetail(q *idempotency.Quota, limit string, secs int64) string {
	var what string
	switch limit {
	case "keys":
		what = fmt.Sprintf("%d new keys per %v", q.MaxKeys, q.Window)
	case "in_flight":
		what = fmt.Sprintf("%d requests in progress at once", q.MaxInFlight)
	default:
		what = fmt.Sprintf("%d bytes of stored responses per %v", q.MaxBytes, q.Window)
	}
	return fmt.Sprintf("This client reached its limit of %s. Nothing was processed; retry in %d seconds (the key stays unused).", what, max(1, secs))
}
