package sealed

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"testing"
)

// FuzzFormat: the parser of the sealed plaintext (headers, then the body)
// and of a reference's body never panics, reports every failure as
// ErrCorrupt, and what it parses encodes back to an equal value.
func FuzzFormat(f *testing.F) {
	f.Add(appendHeader(nil, http.Header{"Location": {"/a"}, "X": {"1", "", "\x00\xff"}}))
	f.Add(append(appendHeader(nil, nil), "body"...))
	f.Add([]byte{0x80})
	f.Add([]byte{5, 1, 'a', 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add(appendString(nil, "resource-42"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &reader{b: data}
		h := r.header()
		if r.err != nil {
			if !errors.Is(r.err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", r.err)
			}
		} else {
			enc := append(appendHeader(nil, h), r.b...)
			r2 := &reader{b: enc}
			h2 := r2.header()
			if r2.err != nil || !reflect.DeepEqual(h, h2) || !bytes.Equal(r.b, r2.b) {
				t.Fatalf("round trip: %v %q -> %v %q (%v)", h, r.b, h2, r2.b, r2.err)
			}
		}
		body := append([]byte(magic+string(kindReference)), data...)
		id, err := parseReference(body)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("reference error %v is not ErrCorrupt", err)
			}
			return
		}
		if got, err := parseReference(append([]byte(magic+string(kindReference)), appendString(nil, id)...)); err != nil || got != id {
			t.Fatalf("reference round trip: %q -> %q, %v", id, got, err)
		}
	})
}
