package backend

import (
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// sameHeader compares headers the way a replay is judged: same names, same
// values in the same order (a name with no values equals a missing one).
func sameHeader(a, b http.Header) bool {
	norm := func(h http.Header) map[string][]string {
		m := map[string][]string{}
		for k, vs := range h {
			if len(vs) > 0 {
				m[k] = vs
			}
		}
		return m
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

func TestHeaderRoundTripBytes(t *testing.T) {
	cases := []http.Header{
		nil,
		{},
		{"Content-Type": {"application/json"}},
		{"X-Latin1": {"caf\xe9"}, "X-Empty": {""}, "X-Many": {"a", "b", "", "\x00\xff"}},
		{"caf\xe9": {"\xc3\x28"}, "": {"v"}},
		{"X-None": {}},
	}
	for _, h := range cases {
		b := MarshalHeader(h)
		got, err := UnmarshalHeader(b)
		if err != nil {
			t.Fatalf("UnmarshalHeader(MarshalHeader(%q)): %v", h, err)
		}
		if !sameHeader(got, h) {
			t.Fatalf("round trip of %q: got %q", h, got)
		}
		if len(h) == 0 && (b != nil || got != nil) {
			t.Fatalf("empty header %q: encoded %v, decoded %#v; want nil, nil", h, b, got)
		}
	}
}

func TestHeaderRefusesMalformed(t *testing.T) {
	for _, b := range [][]byte{
		{headerFormat},                          // no count
		{headerFormat, 1},                       // name missing
		{headerFormat, 1, 5, 'a'},               // name truncated
		{headerFormat, 1, 1, 'a', 2, 0},         // one value of two
		{headerFormat, 0, 0},                    // trailing bytes
		{headerFormat, 0xff, 0xff, 0xff, 1},     // count beyond input
		{headerFormat, 2, 1, 'a', 0, 1, 'a', 0}, // duplicate name
		[]byte(`{"A":["b"]}`),                   // JSON: not an encoding MarshalHeader makes
		[]byte("null"),                          // nor is the JSON literal null
	} {
		if _, err := UnmarshalHeader(b); !errors.Is(err, ErrInvalidHeader) {
			t.Errorf("UnmarshalHeader(%v): got %v, want ErrInvalidHeader", b, err)
		}
	}
}

// FuzzHeader: any header survives a round trip byte-exact, and any bytes
// either decode to a header that re-encodes to an equal header or are
// refused with ErrInvalidHeader; nothing panics.
func FuzzHeader(f *testing.F) {
	f.Add("Content-Type", "application/json", "X-B", "caf\xe9", []byte{headerFormat, 1, 1, 'a', 1, 1, 'b'})
	f.Add("", "", "\x00", "\xff\xfe", []byte{headerFormat, 0})
	f.Fuzz(func(t *testing.T, n1, v1, n2, v2 string, raw []byte) {
		h := http.Header{n1: {v1, v2}, n2: {v2}}
		got, err := UnmarshalHeader(MarshalHeader(h))
		if err != nil || !sameHeader(got, h) {
			t.Fatalf("round trip of %q: got %q, %v", h, got, err)
		}
		d, err := UnmarshalHeader(raw)
		if err != nil {
			if !errors.Is(err, ErrInvalidHeader) {
				t.Fatalf("UnmarshalHeader(%q): error %v does not wrap ErrInvalidHeader", raw, err)
			}
			return
		}
		again, err := UnmarshalHeader(MarshalHeader(d))
		if err != nil || !sameHeader(again, d) {
			t.Fatalf("re-encoding %q: got %q, %v", d, again, err)
		}
	})
}

// TestMarshalHeaderAllocatesOnce: the encoder sizes its buffer up front, so
// a header of any shape costs one allocation.
func TestMarshalHeaderAllocatesOnce(t *testing.T) {
	h := http.Header{
		"Content-Type": {"application/json"},
		"Set-Cookie":   {"a=1", "b=2", strings.Repeat("c", 300)},
		"X-Empty":      {""},
		"X-Bytes":      {"caf\xe9\x00\xff"},
	}
	if n := testing.AllocsPerRun(100, func() { MarshalHeader(h) }); n != 1 {
		t.Fatalf("MarshalHeader: %v allocations, want 1", n)
	}
	// Exactly sized, at every varint length boundary.
	for _, size := range []int{0, 1, 127, 128, 16383, 16384, 1 << 21} {
		many := make([]string, min(size, 200))
		h := http.Header{strings.Repeat("n", size): {strings.Repeat("v", size)}, "X": many}
		if b := MarshalHeader(h); len(b) != cap(b) {
			t.Fatalf("size %d: encoded %d bytes in a buffer of %d", size, len(b), cap(b))
		}
	}
	for n, want := range map[int]int{0: 1, 127: 1, 128: 2, 16383: 2, 16384: 3, 1<<21 - 1: 3, 1 << 21: 4} {
		if got := uvarintLen(n); got != want {
			t.Errorf("uvarintLen(%d) = %d, want %d", n, got, want)
		}
	}
}

// TestHeaderNameWithoutValues: a name with no values decodes to a nil
// slice, whether it was encoded from nil or from an empty slice.
func TestHeaderNameWithoutValues(t *testing.T) {
	for _, vs := range [][]string{nil, {}} {
		got, err := UnmarshalHeader(MarshalHeader(http.Header{"X-None": vs, "A": {"b"}}))
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := got["X-None"]; !ok || v != nil || got.Get("A") != "b" {
			t.Fatalf("decoded %#v: want X-None present with a nil slice", got)
		}
	}
}
