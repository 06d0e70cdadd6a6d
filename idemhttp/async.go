package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/observe"
)

// problemUnknownOperation (404): the status resource of [AsyncStatus] names
// no operation of the caller's scope (none was started with that key, or
// its answer expired).
const problemUnknownOperation = problemBase + "ProblemUnknownOperation"

// defaultAsyncWait is the [AsyncOptions].Wait used when it is zero.
const defaultAsyncWait = time.Second

// AsyncOptions configures [Async] and [AsyncStatus].
type AsyncOptions struct {
	// Options is the key header, scope, fingerprint, limits and problems, as
	// for [Middleware]. Required, with its Scope: the status resource
	// answers a key only to a caller of the key's scope. Its TTL, if set,
	// is the TTL of the operation's answer when [idempotency.Operation].TTL
	// is zero. KeyOptional and Quota are refused: Async has no handler to
	// run without a key, and does not count quotas.
	Options *Options
	// StatusPath is the path of the status resources: the status of an
	// operation is at StatusPath + its status id, the Location of every
	// 202. Required; it starts and ends with "/".
	StatusPath string
	// Secrets seal the key into its status id, so that the Location names
	// the key without showing it (access logs, proxies and browser
	// histories record URLs), and only a caller of the key's scope can use
	// it: the id is the key's id encrypted and authenticated with
	// AES-256-GCM under a key derived from the secret, bound to the scope.
	// Required: each secret is at least 32 random bytes
	// (crypto/rand), kept with the service's other secrets. Every instance
	// of the service that serves the same status resources has the same
	// Secrets, or a 202 from one instance is a 404 on another (and after
	// a restart, if the secret were made at start-up). The first secret
	// seals; every one opens: to rotate, put a new secret first and keep
	// the old one until the operations it named have expired.
	Secrets [][]byte
	// Wait is how long a request waits for its operation before it is
	// answered 202 Accepted: an operation that finishes within it (or
	// whose answer is stored already) is answered as [Middleware] answers.
	// Defaults to one second.
	Wait time.Duration
	// RetryAfter is the Retry-After of a 202 and of a status that is still
	// in progress, rounded up to whole seconds. Defaults to one second.
	RetryAfter time.Duration
}

// Validate reports whether [Async] and [AsyncStatus] would refuse c: an
// error wrapping [idempotency.ErrInvalidConfig] (or [ErrNoScope]) that
// names the field.
func (c *AsyncOptions) Validate() error {
	switch {
	case c == nil:
		return fmt.Errorf("%w: idemhttp: nil AsyncOptions", idempotency.ErrInvalidConfig)
	case c.Options == nil || c.Options.Scope == nil:
		return fmt.Errorf("idemhttp: AsyncOptions.Options: %w", ErrNoScope)
	case c.Options.KeyOptional:
		return fmt.Errorf("%w: idemhttp: AsyncOptions.Options.KeyOptional: Async runs its operation only under a key", idempotency.ErrInvalidConfig)
	case c.Options.Quota != nil:
		return fmt.Errorf("%w: idemhttp: AsyncOptions.Options.Quota: Async does not count quotas; put it on a Middleware", idempotency.ErrInvalidConfig)
	case !strings.HasPrefix(c.StatusPath, "/") || !strings.HasSuffix(c.StatusPath, "/"):
		return fmt.Errorf("%w: idemhttp: AsyncOptions.StatusPath %q must start and end with /", idempotency.ErrInvalidConfig, c.StatusPath)
	case c.Wait < 0 || c.RetryAfter < 0:
		return fmt.Errorf("%w: idemhttp: negative AsyncOptions.Wait or RetryAfter", idempotency.ErrInvalidConfig)
	}
	if err := c.Options.Validate(); err != nil {
		return fmt.Errorf("idemhttp: AsyncOptions.Options: %w", err)
	}
	_, err := newStatusIDs(c.Secrets)
	return err
}

// retryAfter is the Retry-After value, in seconds.
func (c *AsyncOptions) retryAfter() string {
	if c.RetryAfter <= 0 {
		return "1"
	}
	return strconv.FormatInt(int64((c.RetryAfter+time.Second-1)/time.Second), 10)
}

// StatusLocation returns the path of the status resource of key, as the
// Location of [Async]'s 202 names it: for a service that hands it out
// itself (in a listing of a client's operations, say). It fails as
// [AsyncOptions.Validate] does.
func (c *AsyncOptions) StatusLocation(key idempotency.Key) (string, error) {
	if err := c.Validate(); err != nil {
		return "", err
	}
	ids, err := newStatusIDs(c.Secrets)
	if err != nil {
		return "", err
	}
	return c.StatusPath + ids.seal(key), nil
}

// newAsyncHandler builds what Async and AsyncStatus share, refusing a
// bad cfg or a nil g.
func newAsyncHandler[Tx any](g *idempotency.Guard[Tx], cfg *AsyncOptions, who string) (*handler[Tx], *statusIDs, error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	if g == nil {
		return nil, nil, fmt.Errorf("%w: idemhttp: %s was given a nil Guard", idempotency.ErrInvalidConfig, who)
	}
	c := newSettings(cfg.Options)
	if c.ttl != 0 {
		v, err := g.WithTTL(c.ttl)
		if err != nil {
			return nil, nil, fmt.Errorf("idemhttp: AsyncOptions.Options.TTL: %w", err)
		}
		g = v
	}
	ids, err := newStatusIDs(cfg.Secrets)
	if err != nil {
		return nil, nil, err
	}
	return &handler[Tx]{g: g, c: c, st: &mountState{}}, ids, nil
}

// Async returns a handler for requests whose operation may outlive them.
// It runs op under the request's key ([idempotency.Guard.Run]) on a
// goroutine of its own, detached from the request, and waits up to
// cfg.Wait for it:
//
//   - op finished (or its answer was stored already): the answer, byte for
//     byte, as [Middleware] answers (Idempotent-Replayed on a replay, the
//     key's lifetime header);
//   - op still running, held by another request or process, or stopped at
//     a step after a transient failure: 202 Accepted with Location (the
//     status resource, see [AsyncStatus]) and Retry-After. A retry of the
//     request with the key gets the same, or the answer once it is stored;
//   - the key held by another caller's run that has stored nothing yet (a
//     plain Run or Do elsewhere) after Wait and up to a second more: 409
//     in progress, as [Middleware] answers: a 202 is only answered once the
//     operation is stored;
//   - the key used with another request: 422, as [Middleware], also while
//     the operation of the first request runs (its fingerprint is in the
//     store): at once if it ended, after Wait otherwise;
//   - op's Validate refused the input: 400 (or the [Problem] it returned),
//     nothing stored, as [Operation] answers.
//
// The request's body is the operation's input ([idempotency.State.Input]),
// saved with the key. op runs as if [idempotency.Operation].Durable were
// set: the key commits before the first step, and a 202 is answered only
// once it has. Run a [idempotency.Completer] for op in the service: an
// operation whose process died (in its first step or between two) is
// finished by it (or by a retry), and the status resource then serves its
// answer. Requests are refused before anything is written as [Middleware]
// refuses them (400, 413).
//
// A bad configuration is refused here, with an error wrapping
// [idempotency.ErrInvalidConfig] (or [ErrNoScope]): a nil g, an op that
// [idempotency.NewCompleter] refuses (or a store that runs no operations),
// a cfg that [AsyncOptions.Validate] refuses.
func Async[Tx any](g *idempotency.Guard[Tx], op *idempotency.Operation[Tx], cfg *AsyncOptions) (http.Handler, error) {
	h, ids, err := newAsyncHandler(g, cfg, "Async")
	if err != nil {
		return nil, err
	}
	if _, err := idempotency.NewCompleter(h.g, nil, op); err != nil {
		return nil, fmt.Errorf("idemhttp: Async: %w", err)
	}
	// A 202 promises that the operation ends, by a retry or the Completer:
	// it must be in the store from its start, even when its first step
	// fails or its process dies in it.
	durable := *op
	durable.Durable = true
	return &asyncHandler[Tx]{h: h, op: &durable, cfg: cfg, ids: ids}, nil
}

type asyncHandler[Tx any] struct {
	h   *handler[Tx]
	op  *idempotency.Operation[Tx]
	cfg *AsyncOptions
	ids *statusIDs
}

// ran is what a detached run of the operation gave.
type ran struct {
	resp idempotency.Response
	err  error
}

func (a *asyncHandler[Tx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := a.h
	ev := &RequestEvent{Method: r.Method, Outcome: observe.HandlerError}
	defer h.observe(r, ev)()
	key, body, fp, ok := h.admit(w, r, r.Header.Values(h.c.header), ev)
	if !ok {
		return
	}
	done := make(chan ran, 1)
	ctx := context.WithoutCancel(r.Context()) // the operation outlives the request
	go func() {
		resp, err := h.g.Run(ctx, key, fp, body, a.op)
		done <- ran{resp, err}
	}()
	wait := a.cfg.Wait
	if wait == 0 {
		wait = defaultAsyncWait
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case res := <-done:
		a.answer(w, r, ev, key, fp, res)
	case <-timer.C:
		// 202 only once the operation is in the store (its first commit),
		// where the Completer finds it if this process dies; a run that
		// ends first gives its answer. Waited for one more Wait at most
		// (and at least a second, the time a first commit may take): then
		// the key is held by another caller's run that has committed
		// nothing yet, and the request is in progress, not accepted.
		res, ended, st := a.committed(r.Context(), key, fp, done, max(wait, time.Second))
		switch {
		case ended:
			a.answer(w, r, ev, key, fp, res)
		case r.Context().Err() != nil:
			ev.Outcome, ev.Err = observe.Canceled, r.Context().Err() // the run goes on
		case st == storedOther:
			h.fail(w, r, ev, fmt.Errorf("idemhttp: %w: the key's operation runs with another request", idempotency.ErrMismatch), time.Now())
		case st == storedSame:
			ev.Outcome, ev.Status = observe.InProgress, http.StatusAccepted
			a.accepted(w, key)
		default:
			h.fail(w, r, ev, fmt.Errorf("idemhttp: %w: the operation is not stored yet", idempotency.ErrInProgress), time.Now())
		}
	case <-r.Context().Done():
		ev.Outcome, ev.Err = observe.Canceled, r.Context().Err() // the run goes on
	}
}

// storedAs is what the store holds under a key, for the request of a
// fingerprint.
type storedAs int

const (
	storedNone  storedAs = iota // nothing committed (or the store failed)
	storedSame                  // the request's operation, unfinished or held
	storedOther                 // a record of another request
)

// committed waits, up to bound, until the store holds a record of key
// (stored says whose), or the run ended (its result, ended), or ctx ended.
func (a *asyncHandler[Tx]) committed(ctx context.Context, key idempotency.Key, fp string, done <-chan ran, bound time.Duration) (res ran, ended bool, st storedAs) {
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		select {
		case res := <-done:
			return res, true, storedNone
		default:
		}
		if st := a.stored(ctx, key, fp); st != storedNone {
			return ran{}, false, st
		}
		select {
		case res := <-done:
			return res, true, storedNone
		case <-ctx.Done():
			return ran{}, false, storedNone
		case <-deadline.C:
			return ran{}, false, storedNone
		case <-time.After(pause):
		}
	}
}

// stored reports what the store holds under key: the operation of the
// request of fingerprint fp (unfinished or held, not a new key in an
// uncommitted first transaction), a record of another request (whose
// fingerprint is final: the request is refused with 422 even while that
// operation runs), or nothing.
func (a *asyncHandler[Tx]) stored(ctx context.Context, key idempotency.Key, fp string) storedAs {
	return storedFor(ctx, a.h.g, key, fp)
}

// storedFor is [asyncHandler.stored] on g.
func storedFor[Tx any](ctx context.Context, g *idempotency.Guard[Tx], key idempotency.Key, fp string) storedAs {
	info, err := g.Inspect(ctx, key, false)
	switch {
	case err != nil || info.Fingerprint == "" || info.State == idempotency.KeyExpired:
		return storedNone // an expired record counts as absent: a run replaces it
	case info.Fingerprint != fp:
		return storedOther
	case info.Operation != "":
		return storedSame
	}
	return storedNone
}

// answer writes what a run that ended gave.
func (a *asyncHandler[Tx]) answer(w http.ResponseWriter, r *http.Request, ev *RequestEvent, key idempotency.Key, fp string, res ran) {
	h := a.h
	if errors.Is(res.err, idempotency.ErrInProgress) && !errors.Is(res.err, idempotency.ErrStore) {
		switch a.stored(r.Context(), key, fp) {
		case storedSame:
			// Stored and resumable: a retry or the Completer finishes it.
			ev.Outcome, ev.Status, ev.Err = observe.InProgress, http.StatusAccepted, res.err
			a.accepted(w, key)
			return
		case storedOther:
			res.err = fmt.Errorf("%w (%w)", idempotency.ErrMismatch, res.err)
		}
		// A key held by a run that stored nothing yet: 409 in progress,
		// as the middleware answers.
	}
	switch {
	case res.err == nil:
		ev.Outcome, ev.Status = observe.Executed, res.resp.Status
		if res.resp.Replayed {
			ev.Outcome = observe.Replayed
		}
		writeResponse(w, res.resp.Status, h.c.storedHeader(res.resp.Header), res.resp.Body, res.resp.Replayed, h.lifetime(res.resp.ExpiresAt))
	case errors.Is(res.err, idempotency.ErrUnfinished):
		// Stored and resumable: a retry or the Completer finishes it.
		ev.Outcome, ev.Status, ev.Err = observe.InProgress, http.StatusAccepted, res.err
		a.accepted(w, key)
	default:
		h.fail(w, r, ev, res.err, time.Now())
	}
}

// accepted answers 202 with the status resource of key.
func (a *asyncHandler[Tx]) accepted(w http.ResponseWriter, key idempotency.Key) {
	hd := w.Header()
	hd.Set("Location", a.cfg.StatusPath+a.ids.seal(key))
	hd.Set("Retry-After", a.cfg.retryAfter())
	if a.h.c.expose {
		expose(hd, "Location", "Retry-After")
	}
	writeStatusBody(w, http.StatusAccepted, "in_progress")
}

// writeStatusBody writes the JSON body of a status that is not an answer.
func writeStatusBody(w http.ResponseWriter, status int, state string) {
	body := []byte(`{"status":"` + state + `"}`)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
