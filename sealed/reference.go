package sealed

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/go-idempotency/idempotency"
)

// MaxResourceIDLen is the longest resource id a [ReferenceCodec] stores.
const MaxResourceIDLen = 1024

// Reference configures a [ReferenceCodec]: an answer stored as a
// reference to the resource it is about (the order created, the payment
// made) rather than as its body, and rendered again from that resource's
// current state on every replay.
type Reference struct {
	// ResourceID returns the id of the resource an answer is about (its
	// Location header, the id in its body). An error fails the call
	// before anything is stored: fn's writes are rolled back. Required.
	ResourceID func(resp idempotency.Response) (string, error)
	// Headers are the names of the answer's headers stored with the status
	// (in clear, unless the reference is chained with a [Codec]); any
	// other header is not stored. A replay carries them as they were sent.
	Headers []string
	// Render returns the answer for the resource id ResourceID gave for
	// key's first answer. Its Header and Body are replayed, with the
	// stored headers on top, under the stored status, unless it sets a
	// Status of its own (410 for a resource since deleted). An error
	// fails the replay closed (the operation never runs again). Required.
	Render func(ctx context.Context, key idempotency.Key, resourceID string) (idempotency.Response, error)
	// AcceptPlain makes Open return records stored without this codec
	// as they are, instead of failing with [ErrNotSealed]; never a record
	// a Guard marked sealed ([idempotency.StoredSealed]).
	AcceptPlain bool
}

// ReferenceCodec stores an answer as its status, the headers allowed and a
// resource id ([NewReference]). It is safe for concurrent use if Render
// and ResourceID are. Its stored body is:
//
//	"\x00ISR" | len(id) (uvarint) | id
type ReferenceCodec struct {
	cfg     Reference
	headers []string // canonical names
}

// NewReference returns a ReferenceCodec for cfg. A missing ResourceID or
// Render, or an invalid header name, gives an error wrapping
// [idempotency.ErrInvalidConfig].
func NewReference(cfg Reference) (*ReferenceCodec, error) {
	switch {
	case cfg.ResourceID == nil:
		return nil, fmt.Errorf("%w: sealed: Reference.ResourceID is nil", idempotency.ErrInvalidConfig)
	case cfg.Render == nil:
		return nil, fmt.Errorf("%w: sealed: Reference.Render is nil", idempotency.ErrInvalidConfig)
	}
	c := &ReferenceCodec{cfg: cfg}
	for _, name := range cfg.Headers {
		if name == "" || !validHeaderName(name) {
			return nil, fmt.Errorf("%w: sealed: Reference.Headers: invalid header name %q", idempotency.ErrInvalidConfig, name)
		}
		c.headers = append(c.headers, http.CanonicalHeaderKey(name))
	}
	c.cfg.Headers = nil
	return c, nil
}

// validHeaderName reports whether name is an HTTP token.
func validHeaderName(name string) bool {
	for i := range len(name) {
		ch := name[i]
		switch {
		case 'a' <= ch && ch <= 'z', 'A' <= ch && ch <= 'Z', '0' <= ch && ch <= '9':
		case ch < 0x80 && ch > ' ' && ch != 0x7f && !isSeparator(ch):
		default:
			return false
		}
	}
	return true
}

func isSeparator(ch byte) bool {
	switch ch {
	case '(', ')', '<', '>', '@', ',', ';', ':', '\\', '"', '/', '[', ']', '?', '=', '{', '}':
		return true
	}
	return false
}

// errResourceID: ResourceID returned an id that cannot be stored.
var errResourceID = errors.New("sealed: invalid resource id")

// Seal stores resp's status, its allowed headers and the id of its
// resource.
func (c *ReferenceCodec) Seal(_ context.Context, _ idempotency.Key, resp idempotency.Response) (idempotency.Response, error) {
	id, err := c.cfg.ResourceID(resp)
	if err != nil {
		return idempotency.Response{}, fmt.Errorf("sealed: Reference.ResourceID: %w", err)
	}
	if id == "" || len(id) > MaxResourceIDLen {
		return idempotency.Response{}, fmt.Errorf("%w: %d bytes, want 1 to %d", errResourceID, len(id), MaxResourceIDLen)
	}
	var h http.Header
	for _, name := range c.headers {
		if v, ok := resp.Header[name]; ok {
			if h == nil {
				h = http.Header{}
			}
			h[name] = append([]string(nil), v...)
		}
	}
	body := append([]byte(magic), kindReference)
	body = appendString(body, id)
	return idempotency.Response{Status: resp.Status, Header: h, Body: body}, nil
}

// Open renders the answer of the resource the record names.
func (c *ReferenceCodec) Open(ctx context.Context, key idempotency.Key, stored idempotency.Response) (idempotency.Response, error) {
	if kindOf(stored.Body) != kindReference {
		if passPlain(ctx, c.cfg.AcceptPlain, stored.Body) {
			return stored, nil
		}
		return idempotency.Response{}, ErrNotSealed
	}
	id, err := parseReference(stored.Body)
	if err != nil {
		return idempotency.Response{}, err
	}
	r, err := c.cfg.Render(ctx, key, id)
	if err != nil {
		return idempotency.Response{}, fmt.Errorf("sealed: Reference.Render: %w", err)
	}
	out := idempotency.Response{Status: stored.Status, Header: r.Header.Clone(), Body: plainBody(r.Body)}
	if r.Status != 0 {
		out.Status = r.Status
	}
	for name, v := range stored.Header {
		if out.Header == nil {
			out.Header = http.Header{}
		}
		out.Header[name] = append([]string(nil), v...)
	}
	return out, nil
}

// parseReference returns the resource id of a reference's stored body.
func parseReference(body []byte) (string, error) {
	r := &reader{b: body[len(magic)+1:]}
	id := r.string()
	switch {
	case r.err != nil:
		return "", r.err
	case len(r.b) != 0:
		return "", fmt.Errorf("%w: %d bytes after the resource id", ErrCorrupt, len(r.b))
	case id == "" || len(id) > MaxResourceIDLen:
		return "", fmt.Errorf("%w: resource id of %d bytes", ErrCorrupt, len(id))
	}
	return id, nil
}

// Chain returns a codec that seals with each of codecs in order and opens
// in the reverse order: Chain(reference, aead) stores a reference whose
// resource id and headers are encrypted. Nil codecs are skipped. It seals
// an operation's input and step data (the SealData of an [idempotency.Codec]) with those
// of codecs that can, in the same orders; with none that can, an
// operation fails with [idempotency.ErrCodec] before anything is stored.
func Chain(codecs ...idempotency.Codec) idempotency.Codec {
	var cs chain
	for _, c := range codecs {
		if c != nil {
			cs = append(cs, c)
		}
	}
	return cs
}

type chain []idempotency.Codec

// Seal seals with each codec in order.
func (cs chain) Seal(ctx context.Context, key idempotency.Key, resp idempotency.Response) (idempotency.Response, error) {
	for _, c := range cs {
		var err error
		if resp, err = c.Seal(ctx, key, resp); err != nil {
			return idempotency.Response{}, err
		}
	}
	return resp, nil
}

// Open opens with each codec in the reverse order.
func (cs chain) Open(ctx context.Context, key idempotency.Key, stored idempotency.Response) (idempotency.Response, error) {
	for i := len(cs) - 1; i >= 0; i-- {
		var err error
		if stored, err = cs[i].Open(ctx, key, stored); err != nil {
			return idempotency.Response{}, err
		}
	}
	return stored, nil
}

// SealData seals data with each codec that can seal data, in order.
func (cs chain) SealData(ctx context.Context, key idempotency.Key, data []byte) ([]byte, error) {
	sealed := false
	for _, c := range cs {
		if ds, ok := c.(dataSealer); ok {
			var err error
			if data, err = ds.SealData(ctx, key, data); err != nil {
				return nil, err
			}
			sealed = true
		}
	}
	if !sealed {
		return nil, fmt.Errorf("sealed: no codec of the chain seals an operation's data (chain it with a Codec): %w", errors.ErrUnsupported)
	}
	return data, nil
}

// OpenData opens data with each codec that can, in the reverse order.
func (cs chain) OpenData(ctx context.Context, key idempotency.Key, sealed []byte) ([]byte, error) {
	opened := false
	for i := len(cs) - 1; i >= 0; i-- {
		if ds, ok := cs[i].(dataSealer); ok {
			var err error
			if sealed, err = ds.OpenData(ctx, key, sealed); err != nil {
				return nil, err
			}
			opened = true
		}
	}
	if !opened {
		return nil, fmt.Errorf("sealed: no codec of the chain opens an operation's data: %w", errors.ErrUnsupported)
	}
	return sealed, nil
}

// dataSealer is the part of an [idempotency.Codec] that seals an
// operation's input and step data.
type dataSealer interface {
	SealData(ctx context.Context, key idempotency.Key, data []byte) ([]byte, error)
	OpenData(ctx context.Context, key idempotency.Key, sealed []byte) ([]byte, error)
}
