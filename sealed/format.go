package sealed

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/go-idempotency/idempotency"
)

// Errors of Open; the Guard wraps them with [idempotency.ErrCodec].
var (
	// ErrUnknownKey: the record was sealed with a key id that is not in
	// the keyring (removed too early, or not yet rolled out to this
	// instance). Nothing is decrypted; put the key back in the ring.
	ErrUnknownKey = errors.New("sealed: the record was sealed with a key that is not in the keyring")
	// ErrCorrupt: the record is malformed, or fails authentication: it
	// was changed, moved to another key or status, or sealed with another
	// key under the same id.
	ErrCorrupt = errors.New("sealed: the sealed record is malformed or fails authentication")
	// ErrNotSealed: the record was stored without this codec (before it
	// was configured) and the codec was not told to accept such records
	// (AcceptPlain).
	ErrNotSealed = errors.New("sealed: the record is not sealed")
)

// The stored body of a sealed record starts with magic and a kind byte.
const (
	magic         = "\x00IS"
	kindAEAD      = 'A' // AES-256-GCM, version 1
	kindReference = 'R' // a resource id, version 1
	kindData      = 'D' // an operation's input and step data, AES-256-GCM, version 1
)

// kindOf returns the kind of a stored body, 0 if it is not sealed.
func kindOf(body []byte) byte {
	if len(body) < len(magic)+1 || string(body[:len(magic)]) != magic {
		return 0
	}
	return body[len(magic)]
}

// passPlain reports whether a codec whose AcceptPlain is accept returns
// stored as it is: bytes of no kind of this package that the Guard did
// not store sealed ([idempotency.StoredSealed]).
func passPlain(ctx context.Context, accept bool, stored []byte) bool {
	return accept && kindOf(stored) == 0 && !idempotency.StoredSealed(ctx)
}

// appendString appends s with its length as a uvarint.
func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// reader reads the fields of the format; the first error sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%w: bad length", ErrCorrupt)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) string() string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.b)) {
		r.err = fmt.Errorf("%w: a length of %d bytes past the end", ErrCorrupt, n)
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// appendHeader encodes h: the count of names, then each name (sorted) with
// the count of its values and each value, in order.
func appendHeader(b []byte, h http.Header) []byte {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = appendString(b, name)
		b = binary.AppendUvarint(b, uint64(len(h[name])))
		for _, v := range h[name] {
			b = appendString(b, v)
		}
	}
	return b
}

// readHeader decodes what appendHeader encoded; nil for no names. Every
// count is bounded by the bytes left, so a forged count cannot make it
// allocate more than the input's size.
func (r *reader) header() http.Header {
	n := r.uvarint()
	if r.err != nil || n == 0 {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = fmt.Errorf("%w: %d header names in %d bytes", ErrCorrupt, n, len(r.b))
		return nil
	}
	h := make(http.Header, n)
	for range n {
		name := r.string()
		nv := r.uvarint()
		if r.err != nil {
			return nil
		}
		if nv > uint64(len(r.b)) {
			r.err = fmt.Errorf("%w: %d header values in %d bytes", ErrCorrupt, nv, len(r.b))
			return nil
		}
		if _, dup := h[name]; dup {
			r.err = fmt.Errorf("%w: a header name twice", ErrCorrupt)
			return nil
		}
		vals := make([]string, 0, nv)
		for range nv {
			vals = append(vals, r.string())
		}
		if r.err != nil {
			return nil
		}
		h[name] = vals
	}
	return h
}

// additionalData binds a sealed record to its key and status: what the
// ciphertext is authenticated with, besides the record's own prefix.
func additionalData(prefix []byte, key idempotency.Key, status int) []byte {
	ad := make([]byte, 0, len(prefix)+len(key.Scope)+len(key.ID)+16)
	ad = append(ad, prefix...)
	ad = binary.BigEndian.AppendUint16(ad, uint16(status))
	ad = appendString(ad, key.Scope)
	return appendString(ad, key.ID)
}

// plainBody is a copy of body, nil when empty.
func plainBody(body []byte) []byte {
	if len(body) == 0 {
		return nil
	}
	return bytes.Clone(body)
}
