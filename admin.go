package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/observe"
)

// Inspect returns what the store holds for key: its state, fingerprint,
// answer status and size, creation and expiry, and for an unfinished
// operation the step it stopped at and its last failure. The body only
// when body is true. A key with no record gives an error wrapping
// [ErrNotFound]; an invalid key [ErrInvalidKey], before the store is
// asked. The store must implement [backend.KeyAdmin] (every store of this module
// does); others give an error wrapping [errors.ErrUnsupported].
//
// A record sealed by a [Codec] has Sealed set. With body, a completed
// answer is opened as [Guard.Do] opens it for a replay: with
// [Config.Codec], sealed or not (the codec decides what it accepts: an
// error wrapping [ErrCodec] where a replay would fail); an expired one only
// if sealed. A Guard without a Codec leaves a sealed answer's Body nil: it
// never shows the sealed bytes.
func (g *Guard[Tx]) Inspect(ctx context.Context, key Key, body bool) (*KeyInfo, error) {
	info, err := g.inspect(ctx, key, body)
	if err != nil || !body || (info.State != KeyCompleted && info.State != KeyExpired) {
		return info, err
	}
	switch {
	case g.cfg.Codec == nil && info.Sealed:
		info.Body = nil
		return info, nil
	case g.cfg.Codec == nil, info.State == KeyExpired && !info.Sealed:
		// An expired answer stored in clear is shown as it is: no replay
		// serves it, and a strict codec would fail what is not served.
		return info, nil
	}
	resp, err := g.open(ctx, key, info.Sealed, info.Status, info.Header, info.Body)
	if err != nil {
		return nil, &backend.KeyError{Key: key, Err: err}
	}
	info.Status, info.Header, info.Body = resp.Status, resp.Header, resp.Body
	return info, nil
}

// inspect is Inspect with the stored answer as it is stored.
func (g *Guard[Tx]) inspect(ctx context.Context, key Key, body bool) (*KeyInfo, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	ka, ok := g.store.(backend.KeyAdmin)
	if !ok {
		return nil, unsupported(g.store, "backend.KeyAdmin")
	}
	binfo, err := ka.Inspect(ctx, key, body)
	info := infoOf(binfo)
	// A call of this Guard that runs with the key holds it, whatever the
	// store can see of it yet; a completed record is final.
	_, running := g.inFlight(key)
	switch {
	case errors.Is(err, ErrNotFound) && running:
		return &KeyInfo{Key: key, State: KeyInProgress}, nil
	case err != nil:
		return nil, &backend.KeyError{Key: key, Err: err}
	case running && (info.State == KeyUnfinished || info.State == KeyExpired):
		info.State = KeyInProgress
	}
	return info, nil
}

// Forget deletes key's record, so that the next call with the key runs fn
// (or the operation) again, as for a new key: use it to release a key whose
// stored answer is wrong, or an unfinished operation an operator gave up
// on. A key held (by a running call of this Guard, a transaction of the
// store, or a live lease) is refused with [ErrInProgress] and nothing
// changes; Forget never waits. It returns what it deleted (no body), and
// tells the [observe.Observer] an Event with Outcome [observe.Forgotten]. The store must
// implement [backend.KeyAdmin].
func (g *Guard[Tx]) Forget(ctx context.Context, key Key) (*KeyInfo, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	ka, ok := g.store.(backend.KeyAdmin)
	if !ok {
		return nil, unsupported(g.store, "backend.KeyAdmin")
	}
	start := time.Now()
	var (
		info *KeyInfo
		err  error
	)
	if _, held := g.inFlight(key); held {
		err = fmt.Errorf("%w: a call of this Guard runs with the key", ErrInProgress)
	} else {
		var binfo *backend.KeyInfo
		binfo, err = ka.Forget(ctx, key)
		info = infoOf(binfo)
	}
	if err != nil {
		err = &backend.KeyError{Key: key, Err: err}
	}
	if g.cfg.Observer != nil {
		ev := observe.Event{Key: key, Outcome: observe.Forgotten, Duration: time.Since(start), Err: err}
		if err != nil {
			ev.Outcome = outcomeOf(Response{}, err)
		} else {
			ev.Operation, ev.Step = info.Operation, info.Step
		}
		g.cfg.Observer(ctx, ev)
	}
	return info, err
}

// List returns one page of the keys of q.Scope, unfinished and held ones
// first, then the others, each part in byte order of ID; bodies are not
// read. q.Limit is 1 to [backend.MaxListLimit]. The store must implement
// [backend.KeyLister] (the SQL stores do; Redis does not).
func (g *Guard[Tx]) List(ctx context.Context, q ListQuery) (KeyPage, error) {
	if err := backend.ListQuery(q).Validate(); err != nil {
		return KeyPage{}, err
	}
	kl, ok := g.store.(backend.KeyLister)
	if !ok {
		return KeyPage{}, unsupported(g.store, "backend.KeyLister")
	}
	bpage, err := kl.List(ctx, backend.ListQuery(q))
	if err != nil {
		return KeyPage{}, err
	}
	page := KeyPage{Keys: make([]KeyInfo, len(bpage.Keys)), Next: bpage.Next}
	for i := range bpage.Keys {
		page.Keys[i] = *infoOf(&bpage.Keys[i])
	}
	return page, nil
}

// Stats counts the store's records by state. The store must implement
// [backend.KeyLister].
func (g *Guard[Tx]) Stats(ctx context.Context) (Stats, error) {
	kl, ok := g.store.(backend.KeyLister)
	if !ok {
		return Stats{}, unsupported(g.store, "backend.KeyLister")
	}
	st, err := kl.Stats(ctx)
	return Stats(st), err
}

func unsupported(store any, what string) error {
	return fmt.Errorf("idempotency: the store %T does not implement %s: %w", store, what, errors.ErrUnsupported)
}

// inFlight returns the call of key running in g, if any.
func (g *Guard[Tx]) inFlight(key Key) (*call, bool) {
	g.fl.mu.Lock()
	defer g.fl.mu.Unlock()
	c, ok := g.fl.calls[key]
	return c, ok
}
