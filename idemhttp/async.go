package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
)

// ProblemUnknownOperation (404): the status resource of [AsyncStatus] names
// no operation of the caller's scope (none was started with that key, or
// its answer expired).
const ProblemUnknownOperation = problemBase + "ProblemUnknownOperation"

// DefaultAsyncWait is the [AsyncConfig].Wait used when it is zero.
const DefaultAsyncWait = time.Second

// AsyncConfig configures [Async] and [AsyncStatus].
type AsyncConfig struct {
	// Config is the key header, scope, fingerprint, limits and problems, as
	// for [Middleware]. Its Scope is required: the status resource answers
	// a key only to a caller of the key's scope.
	Config *Config
	// StatusPath is the path of the status resources: the status of the
	// operation keyed id is at StatusPath + url.PathEscape(id), the
	// Location of every 202. Required; it ends with "/".
	StatusPath string
	// Wait is how long a request waits for its operation before it is
	// answered 202 Accepted: an operation that finishes within it (or
	// whose answer is stored already) is answered as [Middleware] answers.
	// Defaults to one second.
	Wait time.Duration
	// RetryAfter is the Retry-After of a 202 and of a status that is still
	// in progress, rounded up to whole seconds. Defaults to one second.
	RetryAfter time.Duration
}

// validate reports a config Async and AsyncStatus cannot serve.
func (c *AsyncConfig) validate() error {
	switch {
	case c == nil:
		return fmt.Errorf("%w: idemhttp: nil AsyncConfig", idempotency.ErrInvalidConfig)
	case !strings.HasPrefix(c.StatusPath, "/") || !strings.HasSuffix(c.StatusPath, "/"):
		return fmt.Errorf("%w: idemhttp: AsyncConfig.StatusPath %q must start and end with /", idempotency.ErrInvalidConfig, c.StatusPath)
	case c.Wait < 0 || c.RetryAfter < 0:
		return fmt.Errorf("%w: idemhttp: negative AsyncConfig.Wait or RetryAfter", idempotency.ErrInvalidConfig)
	}
	return nil
}

// retryAfter is the Retry-After value, in seconds.
func (c *AsyncConfig) retryAfter() string {
	if c.RetryAfter <= 0 {
		return "1"
	}
	return strconv.FormatInt(int64((c.RetryAfter+time.Second-1)/time.Second), 10)
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
//   - the key used with another request: 422, as [Middleware].
//
// The request's body is the operation's input ([idempotency.State.Input]),
// saved with the key. op runs as if [idempotency.Operation].Durable were
// set: the key commits before the first step, and a 202 is answered only
// once it has. Run a [idempotency.Completer] for op in the service: an
// operation whose process died (in its first step or between two) is
// finished by it (or by a retry), and the status resource then serves its
// answer. Requests
// are refused before anything is written as [Middleware] refuses them
// (400, 413, a missing Scope). A nil g or op, or a bad cfg, answers 500.
func Async[Tx any](g *idempotency.Guard[Tx], op *idempotency.Operation[Tx], cfg *AsyncConfig) http.Handler {
	a := &asyncHandler[Tx]{op: op, cfg: cfg}
	var c *Config
	if cfg != nil {
		c = cfg.Config
	}
	a.h = &handler[Tx]{g: g, c: newSettings(c), st: &mountState{}}
	a.invalid = cfg.validate()
	if a.invalid == nil && op == nil {
		a.invalid = errors.New("idemhttp: Async was given a nil Operation")
	}
	if op != nil {
		// A 202 promises that the operation ends, by a retry or the
		// Completer: it must be in the store from its start, even when its
		// first step fails or its process dies in it.
		durable := *op
		durable.Durable = true
		a.op = &durable
	}
	if a.invalid == nil && g == nil {
		a.invalid = errors.New("idemhttp: Async was given a nil Guard")
	}
	return a
}

type asyncHandler[Tx any] struct {
	h       *handler[Tx]
	op      *idempotency.Operation[Tx]
	cfg     *AsyncConfig
	invalid error
}

// ran is what a detached run of the operation gave.
type ran struct {
	resp idempotency.Response
	err  error
}

func (a *asyncHandler[Tx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := a.h
	ev := &Event{Method: r.Method, Outcome: idempotency.HandlerError}
	defer h.observe(r, ev)()
	if a.invalid != nil && h.c.scope != nil && h.c.invalid == nil {
		h.internal(w, r, ev, a.invalid)
		return
	}
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
		wait = DefaultAsyncWait
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
		res, ended, stored := a.committed(r.Context(), key, fp, done, max(wait, time.Second))
		switch {
		case ended:
			a.answer(w, r, ev, key, fp, res)
		case r.Context().Err() != nil:
			ev.Outcome, ev.Err = idempotency.Canceled, r.Context().Err() // the run goes on
		case stored:
			ev.Outcome, ev.Status = idempotency.InProgress, http.StatusAccepted
			a.accepted(w, key)
		default:
			h.fail(w, r, ev, fmt.Errorf("idemhttp: %w: the operation is not stored yet", idempotency.ErrInProgress), time.Now())
		}
	case <-r.Context().Done():
		ev.Outcome, ev.Err = idempotency.Canceled, r.Context().Err() // the run goes on
	}
}

// committed waits, up to bound, until the store holds the operation of key
// with fingerprint fp (Inspect names it: stored), or the run ended (its
// result, ended), or ctx ended.
func (a *asyncHandler[Tx]) committed(ctx context.Context, key idempotency.Key, fp string, done <-chan ran, bound time.Duration) (res ran, ended, stored bool) {
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		select {
		case res := <-done:
			return res, true, false
		default:
		}
		if a.stored(ctx, key, fp) {
			return ran{}, false, true
		}
		select {
		case res := <-done:
			return res, true, false
		case <-ctx.Done():
			return ran{}, false, false
		case <-deadline.C:
			return ran{}, false, false
		case <-time.After(pause):
		}
	}
}

// stored reports whether the store holds an operation of key with
// fingerprint fp, unfinished or held (not a new key in an uncommitted
// first transaction).
func (a *asyncHandler[Tx]) stored(ctx context.Context, key idempotency.Key, fp string) bool {
	info, err := a.h.g.Inspect(ctx, key, false)
	return err == nil && info.Operation != "" && info.Fingerprint == fp
}

// answer writes what a run that ended gave.
func (a *asyncHandler[Tx]) answer(w http.ResponseWriter, r *http.Request, ev *Event, key idempotency.Key, fp string, res ran) {
	h := a.h
	switch {
	case res.err == nil:
		ev.Outcome, ev.Status = idempotency.Executed, res.resp.Status
		if res.resp.Replayed {
			ev.Outcome = idempotency.Replayed
		}
		writeResponse(w, res.resp.Status, h.c.storedHeader(res.resp.Header), res.resp.Body, res.resp.Replayed, h.lifetime(res.resp.ExpiresAt))
	case errors.Is(res.err, idempotency.ErrUnfinished),
		errors.Is(res.err, idempotency.ErrInProgress) && !errors.Is(res.err, idempotency.ErrStore) && a.stored(r.Context(), key, fp):
		// Stored and resumable: a retry or the Completer finishes it. A key
		// held by a run that stored nothing yet, or by another request
		// (another fingerprint), is answered as the middleware does: 409
		// in progress.
		ev.Outcome, ev.Status, ev.Err = idempotency.InProgress, http.StatusAccepted, res.err
		a.accepted(w, key)
	default:
		h.fail(w, r, ev, res.err, time.Now())
	}
}

// accepted answers 202 with the status resource of key.
func (a *asyncHandler[Tx]) accepted(w http.ResponseWriter, key idempotency.Key) {
	hd := w.Header()
	hd.Set("Location", a.cfg.StatusPath+url.PathEscape(key.ID))
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

// AsyncStatus returns the handler of the status resources of [Async]: a
// GET of cfg.StatusPath + id answers, for the key (the request's scope,
// id):
//
//   - 202 Accepted with Retry-After and {"status":"in_progress"} while the
//     operation runs, or waits to be resumed (by a retry or the Completer);
//   - the operation's stored answer, byte for byte (Idempotent-Replayed,
//     the key's lifetime header), once it finished;
//   - 404 [ProblemUnknownOperation] for a key of no operation of the
//     caller's scope, or whose answer expired;
//   - 400 [ProblemInvalidKey] for an id that is no valid key.
//
// It never runs anything: the store is only read.
func AsyncStatus[Tx any](g *idempotency.Guard[Tx], cfg *AsyncConfig) http.Handler {
	var c *Config
	if cfg != nil {
		c = cfg.Config
	}
	s := &statusHandler[Tx]{h: &handler[Tx]{g: g, c: newSettings(c), st: &mountState{}}, cfg: cfg}
	s.invalid = cfg.validate()
	if s.invalid == nil && g == nil {
		s.invalid = errors.New("idemhttp: AsyncStatus was given a nil Guard")
	}
	return s
}

type statusHandler[Tx any] struct {
	h       *handler[Tx]
	cfg     *AsyncConfig
	invalid error
}

func (s *statusHandler[Tx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := s.h
	ev := &Event{Method: r.Method, Outcome: idempotency.HandlerError}
	defer h.observe(r, ev)()
	switch {
	case h.c.scope == nil:
		h.refuseNoScope(w, r, ev)
		return
	case h.c.invalid != nil:
		h.refuseInvalid(w, r, ev)
		return
	case s.invalid != nil:
		h.internal(w, r, ev, s.invalid)
		return
	}
	id, err := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), s.cfg.StatusPath))
	if err != nil || !strings.HasPrefix(r.URL.Path, s.cfg.StatusPath) {
		h.invalidKey(w, r, ev, fmt.Errorf("%w: the path names no key", idempotency.ErrInvalidKey))
		return
	}
	key := idempotency.Key{ID: id}
	if err := key.Validate(); err != nil {
		h.invalidKey(w, r, ev, err)
		return
	}
	ev.Key.ID = id
	if key.Scope, err = h.c.scope(r); err != nil {
		if p, ok := errors.AsType[*Problem](err); ok {
			h.reject(w, r, ev, p, err)
			return
		}
		h.internal(w, r, ev, fmt.Errorf("idemhttp: Config.Scope: %w", err))
		return
	}
	ev.Key.Scope = key.Scope
	resp, _, err := h.g.Answer(r.Context(), key)
	switch {
	case err == nil:
		ev.Outcome, ev.Status = idempotency.Replayed, resp.Status
		writeResponse(w, resp.Status, h.c.storedHeader(resp.Header), resp.Body, true, h.lifetime(resp.ExpiresAt))
	case errors.Is(err, idempotency.ErrInProgress):
		ev.Outcome, ev.Status = idempotency.InProgress, http.StatusAccepted
		w.Header().Set("Retry-After", s.cfg.retryAfter())
		writeStatusBody(w, http.StatusAccepted, "in_progress")
	case errors.Is(err, idempotency.ErrNotFound):
		h.reject(w, r, ev, &Problem{Type: ProblemUnknownOperation, Title: "No such operation", Status: http.StatusNotFound,
			Detail: "No operation was started with this key in your scope, or its answer expired."}, err)
	default:
		h.fail(w, r, ev, err, time.Now())
	}
}
