package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/observe"
)

// problemUnfinished (503, with Retry-After): an operation's step failed
// with a transient error (a processor that timed out, a store that
// failed between two steps). Its last committed step stands: a retry with
// the same key resumes after it, and so does a [idempotency.Completer].
const problemUnfinished = problemBase + "ProblemUnfinished"

// unfinishedDetail is the detail of ProblemUnfinished.
const unfinishedDetail = "The operation stopped after a transient failure; its committed steps stand. " +
	"Retry with the same key to resume it."

// Operation returns a handler that runs op under each request's key
// ([idempotency.Guard.Run]) and answers when it ends: the synchronous
// counterpart of [Async]. The request's body is the operation's input
// ([idempotency.State.Input]); a request is refused before anything is
// written as [Middleware] refuses it (a missing or invalid key 400, a body
// over [Options].MaxRequestBody 413, a Scope's error). Then:
//
//   - op's Validate refuses the input: 400 ProblemInvalidBody whose
//     detail is the error's text, or the *[Problem] the error is or wraps
//     (a 401, a 422 of the service's own). Nothing is stored: the
//     corrected request with the same key runs;
//   - the operation finished (now, or earlier: a replay): its answer, byte
//     for byte, as [Middleware] answers (Idempotent-Replayed on a replay,
//     the key's lifetime header). A [idempotency.FinalAnswer] is an answer;
//   - the key used with another request: 422 [ProblemMismatch], also
//     while the first request's operation runs (after the Guard's
//     [idempotency.Config].WaitTimeout, its stored fingerprint read);
//   - the key held by another request that is running: 409 (or 425)
//     [ProblemInProgress] with Retry-After, after the WaitTimeout;
//   - a step's transient failure: 503 ProblemUnfinished with Retry-After:
//     a retry with the same key (or the Completer) resumes the operation;
//   - the store failed or is busy: 503 ProblemStoreUnavailable; its
//     schema is missing: 500 ProblemInternal; a Codec that cannot open
//     the stored answer: 503.
//
// The run uses the request's context: a client that goes away stops it
// between two steps, with its committed steps kept for a retry or the
// Completer. Run a Completer for op in the service.
//
// A bad configuration is refused here, with an error wrapping
// [idempotency.ErrInvalidConfig] (or [ErrNoScope]): a nil g, an op that
// [idempotency.NewCompleter] refuses (or a store that runs no operations),
// a cfg that [Options.Validate] refuses, or that sets KeyOptional or Quota
// (which Operation does not apply).
func Operation[Tx any](g *idempotency.Guard[Tx], op *idempotency.Operation[Tx], cfg *Options) (http.Handler, error) {
	switch err := cfg.Validate(); {
	case err != nil:
		return nil, fmt.Errorf("idemhttp: Operation: %w", err)
	case cfg.KeyOptional:
		return nil, fmt.Errorf("%w: idemhttp: Operation: Options.KeyOptional: an operation runs only under a key", idempotency.ErrInvalidConfig)
	case cfg.Quota != nil:
		return nil, fmt.Errorf("%w: idemhttp: Operation: Options.Quota: Operation does not count quotas; put it on a Middleware", idempotency.ErrInvalidConfig)
	case g == nil:
		return nil, fmt.Errorf("%w: idemhttp: Operation was given a nil Guard", idempotency.ErrInvalidConfig)
	}
	c := newSettings(cfg)
	if c.ttl != 0 {
		v, err := g.WithTTL(c.ttl)
		if err != nil {
			return nil, fmt.Errorf("idemhttp: Operation: Options.TTL: %w", err)
		}
		g = v
	}
	if _, err := idempotency.NewCompleter(g, nil, op); err != nil {
		return nil, fmt.Errorf("idemhttp: Operation: %w", err)
	}
	return &opHandler[Tx]{h: &handler[Tx]{g: g, c: c, st: &mountState{}}, op: op}, nil
}

type opHandler[Tx any] struct {
	h  *handler[Tx]
	op *idempotency.Operation[Tx]
}

func (o *opHandler[Tx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := o.h
	ev := &RequestEvent{Method: r.Method, Outcome: observe.HandlerError}
	defer h.observe(r, ev)()
	key, body, fp, ok := h.admit(w, r, r.Header.Values(h.c.header), ev)
	if !ok {
		return
	}
	arrived := time.Now()
	resp, err := h.g.Run(r.Context(), key, fp, body, o.op)
	if err != nil {
		if errors.Is(err, idempotency.ErrInProgress) && !errors.Is(err, idempotency.ErrStore) &&
			storedFor(r.Context(), h.g, key, fp) == storedOther {
			// The key's operation runs for another request: its stored
			// fingerprint makes the refusal final, not a retry's matter.
			err = fmt.Errorf("%w (%w)", idempotency.ErrMismatch, err)
		}
		h.fail(w, r, ev, err, arrived)
		return
	}
	ev.Outcome, ev.Status = observe.Executed, resp.Status
	if resp.Replayed {
		ev.Outcome = observe.Replayed
	}
	writeResponse(w, resp.Status, h.c.storedHeader(resp.Header), resp.Body, resp.Replayed, h.lifetime(resp.ExpiresAt))
}

// invalidInput answers an input an operation's Validate refused (err
// matches [idempotency.ErrInvalidInput]): the *Problem it wraps, or 400
// ProblemInvalidBody with Validate's text. Nothing was stored.
func (h *handler[Tx]) invalidInput(w http.ResponseWriter, r *http.Request, ev *RequestEvent, err error) {
	if p, ok := errors.AsType[*Problem](err); ok {
		h.reject(w, r, ev, p, err)
		return
	}
	detail := err.Error()
	// Run's error reads `idempotency: operation "name": invalid input:
	// <Validate's text>`: the client is shown Validate's text.
	if _, after, ok := strings.Cut(detail, "invalid input: "); ok {
		detail = after
	}
	h.reject(w, r, ev, &Problem{Type: problemInvalidBody, Title: "Request body is invalid", Status: http.StatusBadRequest,
		Detail: detail}, err)
}
