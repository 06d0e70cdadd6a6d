package idempotency

import (
	"context"
	"errors"
	"fmt"
)

// ErrCodec: the [Config.Codec] could not seal an answer before it was
// stored (fn's writes were rolled back and the key left free), or could
// not open a stored one (an unknown key id, a record that fails
// authentication). A stored answer that cannot be opened is never run
// again: the call fails closed, and retrying with the same key stays safe
// (it replays once the codec can open it). The codec's error stays in the
// chain.
var ErrCodec = errors.New("idempotency: the stored answer could not be sealed or opened")

// Codec transforms the answers a [Guard] stores and reads back: encryption
// at rest, or an answer stored as a reference to a resource (package
// sealed provides both). The Guard seals every answer it stores (the
// answer of [Guard.Do]'s fn, of an [Operation]'s Finish or Stop) and opens
// every answer it replays from the store. Callers handed an answer in
// memory by the call that made it get it as fn returned it, never sealed.
// The key and the fingerprint are never given to the codec: look-ups stay
// exact.
//
// Seal and Open run on the calling goroutine, Seal inside the store's
// transaction (before its commit), Open after the store's connection was
// released. They must be safe for concurrent use.
type Codec interface {
	// Seal returns what is stored for resp, the answer of key. Its Status
	// must be in 100..599; its Header and Body may be anything the store
	// keeps byte-exact. resp belongs to the caller: Seal must not change
	// it.
	Seal(ctx context.Context, key Key, resp Response) (Response, error)
	// Open returns the answer stored as stored for key: the inverse of
	// Seal. It fails, rather than guess, for a record it cannot
	// authenticate.
	Open(ctx context.Context, key Key, stored Response) (Response, error)
}

// seal returns what is stored for resp: resp itself without a codec.
func (g *Guard[Tx]) seal(ctx context.Context, key Key, resp Response) (Response, error) {
	if g.cfg.Codec == nil {
		return resp, nil
	}
	out, err := g.cfg.Codec.Seal(ctx, key, cloneResponse(resp))
	switch {
	case err != nil:
		return Response{}, fmt.Errorf("%w: seal: %w", ErrCodec, err)
	case out.Status < 100 || out.Status > 599:
		return Response{}, fmt.Errorf("%w: seal: sealed status %d outside 100..599", ErrCodec, out.Status)
	}
	out.Replayed = false
	return out, nil
}

// replay returns the answer rec holds, opened by the codec, as a replay.
func (g *Guard[Tx]) replay(ctx context.Context, key Key, rec *Record) (Response, error) {
	resp := rec.Response()
	if g.cfg.Codec == nil {
		return resp, nil
	}
	out, err := g.cfg.Codec.Open(ctx, key, resp)
	if err != nil {
		return Response{}, fmt.Errorf("%w: open: %w", ErrCodec, err)
	}
	if out.Status < 100 || out.Status > 599 {
		return Response{}, fmt.Errorf("%w: open: status %d outside 100..599", ErrCodec, out.Status)
	}
	out.Replayed, out.ExpiresAt = true, rec.ExpiresAt
	return out, nil
}
