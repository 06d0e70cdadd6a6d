package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/go-idempotency/idempotency/backend"
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
// answer of [Guard.Do]'s fn, of an [Operation]'s Finish or FinalAnswer) and opens
// every answer it replays from the store. Callers handed an answer in
// memory by the call that made it get it as fn returned it, never sealed.
// The key and the fingerprint are never given to the codec: look-ups stay
// exact.
//
// Seal and Open run on the calling goroutine, Seal inside the store's
// transaction (before its commit), Open after the store's connection was
// released. They must be safe for concurrent use.
//
// A Codec given to a Guard that runs operations ([Guard.Run], the
// [Completer]) must also seal what an unfinished [Operation] stores
// between its steps, the caller's input and the steps' data ([State.Set]),
// with two more methods:
//
//	SealData(ctx context.Context, key Key, data []byte) ([]byte, error)
//	OpenData(ctx context.Context, key Key, sealed []byte) ([]byte, error)
//
// They run on the calling goroutine, inside the store's transaction, and
// must be safe for concurrent use; OpenData fails, rather than guess, for
// data it cannot authenticate as sealed for key. Without them, Run and
// the Completer fail with [ErrInvalidConfig] before anything is written,
// so that an input such as a card token is never stored in clear beside
// sealed answers. sealed.Codec (and a sealed.Chain holding one) has them.
type Codec interface {
	// Seal returns what is stored for resp, the answer of key. Its Status
	// must be in 100..599; its Header and Body may be anything the store
	// keeps byte-exact. resp belongs to the caller: Seal must not change
	// it.
	Seal(ctx context.Context, key Key, resp Response) (Response, error)
	// Open returns the answer stored as stored for key: the inverse of
	// Seal. It fails, rather than guess, for a record it cannot
	// authenticate. [StoredSealed](ctx) reports whether the Guard marked
	// the record sealed when it stored it.
	Open(ctx context.Context, key Key, stored Response) (Response, error)
}

type storedSealedKey struct{}

// StoredSealed reports whether what a [Codec]'s Open or OpenData is asked
// to open was stored sealed: a Guard with a Codec marks every answer it
// seals, and stores an operation's sealed input and data apart from clear
// ones, so it knows, whatever the bytes look like. It calls Open and
// OpenData with a context that says so; other contexts report false.
//
// A Codec that passes through what was stored in clear, for the time a
// switch to sealing takes (sealed.Keyring.AcceptPlain), must not pass
// through what StoredSealed reports: those bytes were sealed, and if they
// do not open they are damaged or were sealed by another codec, never an
// answer to serve as it is.
func StoredSealed(ctx context.Context) bool {
	sealed, _ := ctx.Value(storedSealedKey{}).(bool)
	return sealed
}

// withStoredSealed returns ctx for a Codec's Open or OpenData of what was
// stored sealed or, if not sealed, in clear (see [StoredSealed]).
func withStoredSealed(ctx context.Context, sealed bool) context.Context {
	return context.WithValue(ctx, storedSealedKey{}, sealed)
}

// dataSealer is the optional part of a [Codec] that seals an
// operation's input and step data (see Codec).
type dataSealer interface {
	SealData(ctx context.Context, key Key, data []byte) ([]byte, error)
	OpenData(ctx context.Context, key Key, sealed []byte) ([]byte, error)
}

// sealedHeader is the header name under which a [Guard] with a Codec
// marks every answer it stores sealed. It is not a valid HTTP header name
// (a colon cannot start one), so no handler's answer carries it: fn's
// answer with it is refused ([ErrInvalidResponse]). It lives in the
// record's stored header, apart from the body, so that every reader, with
// a Codec or without, tells a sealed record from a plain one before it
// looks at the bytes, and a reader that cannot open it fails closed.
const sealedHeader = ":sealed"

// isSealed reports whether a stored header marks its record sealed.
func isSealed(h http.Header) bool {
	_, ok := h[sealedHeader]
	return ok
}

// unsealedHeader is h without the mark of a sealed record.
func unsealedHeader(h http.Header) http.Header {
	if !isSealed(h) {
		return h
	}
	h = h.Clone()
	delete(h, sealedHeader)
	if len(h) == 0 {
		return nil
	}
	return h
}

// seal returns what is stored for resp: resp itself without a codec.
func (g *Guard[Tx]) seal(ctx context.Context, key Key, resp Response) (Response, error) {
	if _, ok := resp.Header[sealedHeader]; ok {
		return Response{}, fmt.Errorf("%w: header name %q is reserved", ErrInvalidResponse, sealedHeader)
	}
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
	h := make(http.Header, len(out.Header)+1)
	for name, vs := range out.Header {
		h[name] = vs
	}
	h[sealedHeader] = []string{"1"}
	out.Header, out.Replayed = h, false
	return out, nil
}

// replay returns the answer rec holds, opened by the codec, as a replay.
func (g *Guard[Tx]) replay(ctx context.Context, key Key, rec *backend.Record) (Response, error) {
	out, err := g.open(ctx, key, isSealed(rec.Header), rec.Status, rec.Header, rec.Body)
	if err != nil {
		return Response{}, err
	}
	out.Replayed, out.ExpiresAt = true, rec.ExpiresAt
	return out, nil
}

// open returns the answer stored as status, h and body, opened by the
// codec. A record marked sealed needs a codec: without one it fails with
// [ErrCodec] rather than serve the sealed bytes, and the codec is told
// ([StoredSealed]) not to take it for a plain one. A record not marked (a
// plain one, or one sealed before records were marked) goes to the codec
// as it is, which decides (sealed.Keyring.AcceptPlain).
func (g *Guard[Tx]) open(ctx context.Context, key Key, sealed bool, status int, h http.Header, body []byte) (Response, error) {
	if sealed {
		h = unsealedHeader(h)
	}
	resp := Response{Status: status, Header: h, Body: body}
	if g.cfg.Codec == nil {
		if sealed {
			return Response{}, fmt.Errorf("%w: open: the stored answer is sealed and this Guard has no Config.Codec", ErrCodec)
		}
		return resp, nil
	}
	out, err := g.cfg.Codec.Open(withStoredSealed(ctx, sealed), key, resp)
	if err != nil {
		return Response{}, fmt.Errorf("%w: open: %w", ErrCodec, err)
	}
	if out.Status < 100 || out.Status > 599 {
		return Response{}, fmt.Errorf("%w: open: status %d outside 100..599", ErrCodec, out.Status)
	}
	return out, nil
}

// dataSealer returns the Codec's SealData and OpenData: nil without a Codec, an
// error wrapping [ErrInvalidConfig] for a Codec that cannot seal data.
func (g *Guard[Tx]) dataSealer() (dataSealer, error) {
	if g.cfg.Codec == nil {
		return nil, nil
	}
	ds, ok := g.cfg.Codec.(dataSealer)
	if !ok {
		return nil, fmt.Errorf("%w: Config.Codec %T cannot seal an operation's input and step data (it has no SealData and OpenData methods), "+
			"so operations would store them in clear; chain it with sealed.Codec, or run operations on a Guard without a Codec", ErrInvalidConfig, g.cfg.Codec)
	}
	return ds, nil
}

// encodeProgress returns what is stored for p: with a Codec, its input and
// data sealed.
func (g *Guard[Tx]) encodeProgress(ctx context.Context, key Key, p progress) ([]byte, error) {
	ds, err := g.dataSealer()
	if err != nil || ds == nil || p.sealed != nil {
		if err != nil {
			return nil, err
		}
		return p.encode()
	}
	inner, err := progress{Input: p.Input, Data: p.Data}.encode()
	if err != nil {
		return nil, err
	}
	sealed, err := ds.SealData(ctx, key, inner)
	if err != nil {
		return nil, fmt.Errorf("%w: seal the operation's input and data: %w", ErrCodec, err)
	}
	return progress{Op: p.Op, Step: p.Step, Failure: p.Failure, sealed: append([]byte{}, sealed...)}.encode()
}

// openProgress returns p with its input and data opened by the Codec.
// Without a Codec, progress stored in clear is taken as it is and sealed
// progress fails with [ErrCodec]. With one, sealed progress is opened, and
// progress stored in clear (by a Guard without a Codec, or written into
// the table by hand) goes to OpenData in its clear encoding, which
// decides, as Open does for an answer stored in clear: sealed.Codec
// refuses it unless its Keyring has AcceptPlain. The next save seals it.
func (g *Guard[Tx]) openProgress(ctx context.Context, key Key, p progress) (progress, error) {
	ds, err := g.dataSealer()
	switch {
	case err != nil:
		return p, err
	case ds == nil && p.sealed != nil:
		return p, fmt.Errorf("%w: open: the operation's input and data are sealed and this Guard has no Config.Codec", ErrCodec)
	case ds == nil:
		return p, nil
	}
	stored := p.sealed
	if stored == nil {
		if stored, err = (progress{Input: p.Input, Data: p.Data}).encode(); err != nil {
			return p, err
		}
	}
	inner, err := ds.OpenData(withStoredSealed(ctx, p.sealed != nil), key, stored)
	if err != nil {
		if p.sealed == nil {
			return p, fmt.Errorf("%w: the operation's input and data are stored in clear, and Config.Codec does not accept them: %w", ErrCodec, err)
		}
		return p, fmt.Errorf("%w: open the operation's input and data: %w", ErrCodec, err)
	}
	q, err := decodeProgress(inner)
	if err != nil || q.sealed != nil {
		return p, fmt.Errorf("%w: open the operation's input and data: %w", ErrCodec, errors.Join(err, errProgress))
	}
	p.Input, p.Data, p.sealed = q.Input, q.Data, nil
	return p, nil
}
