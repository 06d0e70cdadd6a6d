package backend

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
)

// headerFormat is the first byte of an encoding made by [MarshalHeader].
const headerFormat = 0x01

// ErrInvalidHeader: bytes given to [UnmarshalHeader] are not an encoding
// that [MarshalHeader] makes.
var ErrInvalidHeader = errors.New("idempotency: invalid header encoding")

// MarshalHeader encodes h for storage, byte-exact: names and values may hold
// any bytes, valid UTF-8 or not, and come back unchanged from
// [UnmarshalHeader], in the same order within each name. A nil or empty h
// encodes to nil, which decodes to a nil header.
//
// The format is a version byte (1) followed by uvarint-length-prefixed
// fields: the number of names, then per name its bytes, its number of
// values and each value's bytes. Stores keep the result in a binary column
// (BYTEA, LONGBLOB, BLOB, a Redis string).
func MarshalHeader(h http.Header) []byte {
	if len(h) == 0 {
		return nil
	}
	n := 1 + uvarintLen(len(h)) // the exact size: one allocation, no slack
	for name, vs := range h {
		n += uvarintLen(len(name)) + len(name) + uvarintLen(len(vs))
		for _, v := range vs {
			n += uvarintLen(len(v)) + len(v)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, headerFormat)
	b = binary.AppendUvarint(b, uint64(len(h)))
	for name, vs := range h {
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

// uvarintLen is how many bytes binary.AppendUvarint writes for n.
func uvarintLen(n int) int {
	size := 1
	for x := uint64(n); x >= 0x80; x >>= 7 {
		size++
	}
	return size
}

// UnmarshalHeader decodes what [MarshalHeader] encoded. Empty input gives
// a nil header. Any other input gives an error wrapping [ErrInvalidHeader].
func UnmarshalHeader(b []byte) (http.Header, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] != headerFormat {
		return nil, fmt.Errorf("%w: format byte %#x, want %#x", ErrInvalidHeader, b[0], headerFormat)
	}
	// One string holds every name and value: they are substrings of it.
	d := headerDecoder{b: b[1:], s: string(b[1:])}
	names := d.count()
	h := make(http.Header, min(names, 64))
	for i := 0; i < names && d.err == nil; i++ {
		name := d.bytes()
		nv := d.count()
		if d.err != nil {
			break
		}
		var vs []string
		if nv > 0 {
			vs = make([]string, 0, nv)
		}
		for j := 0; j < nv && d.err == nil; j++ {
			vs = append(vs, d.bytes())
		}
		if _, dup := h[name]; dup && d.err == nil {
			d.err = fmt.Errorf("name %q twice", name)
		}
		h[name] = vs
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidHeader, d.err)
	}
	return h, nil
}

// headerDecoder reads an encoding from b; s holds the same bytes as b, as
// a string that the names and values are cut from.
type headerDecoder struct {
	b   []byte
	s   string
	err error
}

func (d *headerDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("truncated or overlong length")
		return 0
	}
	d.b, d.s = d.b[n:], d.s[n:]
	return v
}

// count reads a count of items, each at least one byte long, so that a
// count larger than the remaining input is refused before allocating.
func (d *headerDecoder) count() int {
	v := d.uvarint()
	if d.err != nil {
		return 0
	}
	if v > uint64(len(d.b)) {
		d.err = fmt.Errorf("count %d exceeds the %d bytes left", v, len(d.b))
		return 0
	}
	return int(v)
}

func (d *headerDecoder) bytes() string {
	v := d.uvarint()
	if d.err == nil && v > uint64(len(d.b)) {
		d.err = fmt.Errorf("length %d exceeds the %d bytes left", v, len(d.b))
	}
	if d.err != nil {
		return ""
	}
	s := d.s[:v]
	d.b, d.s = d.b[v:], d.s[v:]
	return s
}
