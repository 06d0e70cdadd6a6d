package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/observe"
)

// AsyncStatus returns the handler of the status resources of [Async]: a
// GET of cfg.StatusPath + id, where id is the status id of a Location
// [Async] answered, answers, for its key:
//
//   - 202 Accepted with Retry-After and {"status":"in_progress"} while the
//     operation runs, or waits to be resumed (by a retry or the Completer);
//   - the operation's stored answer, byte for byte (Idempotent-Replayed,
//     the key's lifetime header), once it finished;
//   - 404 ProblemUnknownOperation for an id that names no operation of
//     the caller's scope: one no secret of cfg.Secrets opens in that scope
//     (forged, another scope's), or of a key whose answer expired.
//
// It never runs anything: the store is only read. A bad configuration is
// refused here, as by [Async].
func AsyncStatus[Tx any](g *idempotency.Guard[Tx], cfg *AsyncOptions) (http.Handler, error) {
	h, ids, err := newAsyncHandler(g, cfg, "AsyncStatus")
	if err != nil {
		return nil, err
	}
	return &statusHandler[Tx]{h: h, cfg: cfg, ids: ids}, nil
}

type statusHandler[Tx any] struct {
	h   *handler[Tx]
	cfg *AsyncOptions
	ids *statusIDs
}

func (s *statusHandler[Tx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := s.h
	ev := &RequestEvent{Method: r.Method, Outcome: observe.HandlerError}
	defer h.observe(r, ev)()
	unknown := func(err error) {
		h.reject(w, r, ev, &Problem{Type: problemUnknownOperation, Title: "No such operation", Status: http.StatusNotFound,
			Detail: "No operation was started with this key in your scope, or its answer expired."}, err)
	}
	scope, err := h.c.scope(r)
	if err != nil {
		if p, ok := errors.AsType[*Problem](err); ok {
			h.reject(w, r, ev, p, err)
			return
		}
		h.internal(w, r, ev, fmt.Errorf("idemhttp: Options.Scope: %w", err))
		return
	}
	ev.Key.Scope = scope
	id, ok := "", strings.HasPrefix(r.URL.Path, s.cfg.StatusPath)
	if ok {
		id, ok = s.ids.open(scope, strings.TrimPrefix(r.URL.Path, s.cfg.StatusPath))
	}
	if !ok {
		unknown(fmt.Errorf("%w: the path names no operation of the scope", idempotency.ErrNotFound))
		return
	}
	key := idempotency.Key{Scope: scope, ID: id}
	ev.Key.ID = id
	resp, err := h.answer(r.Context(), key)
	switch {
	case err == nil:
		ev.Outcome, ev.Status = observe.Replayed, resp.Status
		writeResponse(w, resp.Status, h.c.storedHeader(resp.Header), resp.Body, true, h.lifetime(resp.ExpiresAt))
	case errors.Is(err, idempotency.ErrInProgress):
		ev.Outcome, ev.Status = observe.InProgress, http.StatusAccepted
		w.Header().Set("Retry-After", s.cfg.retryAfter())
		writeStatusBody(w, http.StatusAccepted, "in_progress")
	case errors.Is(err, idempotency.ErrNotFound):
		unknown(err)
	default:
		h.fail(w, r, ev, err, time.Now())
	}
}

// answer is the answer stored for key, opened by the Guard's Codec, as a
// replay, without running anything and without a fingerprint: what the
// status resource serves. A key in progress or unfinished gives an error
// wrapping [idempotency.ErrInProgress]; one with no live record (absent,
// expired) [idempotency.ErrNotFound]. A sealed answer that the Guard has
// no Codec to open fails closed with [idempotency.ErrCodec]: the sealed
// bytes are never served.
func (h *handler[Tx]) answer(ctx context.Context, key idempotency.Key) (idempotency.Response, error) {
	info, err := h.g.Inspect(ctx, key, true)
	if err != nil {
		return idempotency.Response{}, err
	}
	switch info.State {
	case idempotency.KeyInProgress, idempotency.KeyUnfinished:
		return idempotency.Response{}, fmt.Errorf("%w: the key %v is %s", idempotency.ErrInProgress, key, info.State)
	case idempotency.KeyCompleted:
	default:
		return idempotency.Response{}, fmt.Errorf("%w: the key %v is %s", idempotency.ErrNotFound, key, info.State)
	}
	if info.Sealed && info.Body == nil {
		return idempotency.Response{}, fmt.Errorf("%w: the answer of %v is sealed and the Guard has no Codec to open it", idempotency.ErrCodec, key)
	}
	return idempotency.Response{Status: info.Status, Header: info.Header, Body: info.Body, Replayed: true, ExpiresAt: info.ExpiresAt}, nil
}
