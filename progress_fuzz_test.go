package idempotency

import (
	"bytes"
	"maps"
	"testing"
)

func sameProgress(a, b progress) bool {
	return a.Op == b.Op && a.Step == b.Step && a.Failure == b.Failure && bytes.Equal(a.Input, b.Input) &&
		len(a.Data) == len(b.Data) && maps.Equal(a.Data, b.Data) && bytes.Equal(a.sealed, b.sealed) && (a.sealed == nil) == (b.sealed == nil)
}

// FuzzProgress: what encode writes decodes to the same progress, and any
// bytes either decode to a progress that encodes and decodes to itself, or
// give errProgress; never a panic.
func FuzzProgress(f *testing.F) {
	f.Add("checkout", "charge", []byte(`{"amount":5}`), "", "charge", "ch_1", []byte("idp1\x00"))
	f.Add("", "", []byte(nil), "charge: 503", "", "", []byte("idp1\x01a\x00\x00\x00\x02\x01b\x00\x01a\x00"))
	f.Add("op", "\xff", []byte{0, 1, 2}, "x", "k\x00", "\xfe", []byte("idp"))
	f.Add("checkout", "charge", []byte("\x00ISD\x02k1"), "", "", "", []byte("ids1\x08checkout\x06charge\x00\x04\x00ISD"))
	f.Fuzz(func(t *testing.T, op, step string, input []byte, failure, name, value string, raw []byte) {
		p := progress{Op: op, Step: step, Input: input, Failure: failure, Data: map[string]string{name: value, name + "2": value}}
		if len(input) == 0 {
			p.Input = nil
		}
		b, err := p.encode()
		if err != nil {
			t.Fatal(err)
		}
		q, err := decodeProgress(b)
		if err != nil || !sameProgress(p, q) {
			t.Fatalf("round trip of %+v: %+v, %v", p, q, err)
		}
		// The same progress with its input and data sealed (as a Guard
		// with a Codec stores it): the sealed bytes come back as they
		// were, the fields in clear too.
		s := progress{Op: op, Step: step, Failure: failure, sealed: append([]byte{}, input...)}
		if b, err = s.encode(); err != nil {
			t.Fatal(err)
		}
		if q, err = decodeProgress(b); err != nil || !sameProgress(s, q) {
			t.Fatalf("round trip of sealed %+v: %+v, %v", s, q, err)
		}
		d, err := decodeProgress(raw)
		if err != nil {
			return
		}
		b2, err := d.encode()
		if err != nil {
			t.Fatal(err)
		}
		d2, err := decodeProgress(b2)
		if err != nil || !sameProgress(d, d2) {
			t.Fatalf("%q decoded to %+v, which re-decodes to %+v, %v", raw, d, d2, err)
		}
	})
}

func TestProgressCorrupt(t *testing.T) {
	good, err := progress{Op: "op", Step: "s", Data: map[string]string{"a": "1", "b": "2"}}.encode()
	if err != nil {
		t.Fatal(err)
	}
	for i := range len(good) {
		if _, err := decodeProgress(good[:i]); err == nil {
			t.Errorf("truncated at %d: decoded", i)
		}
	}
	if _, err := decodeProgress(append(bytes.Clone(good), 0)); err == nil {
		t.Error("trailing byte: decoded")
	}
}
