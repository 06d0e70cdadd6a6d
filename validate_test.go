package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/memstore"
)

// keySpec is the documented key space, written independently of
// Key.Validate: an ID of 1 to 255 bytes, each 0x20 to 0x7E; a Scope of at
// most 255 bytes of valid UTF-8 without NUL.
func keySpec(k idempotency.Key) bool {
	if len(k.ID) < 1 || len(k.ID) > 255 || len(k.Scope) > 255 {
		return false
	}
	for _, c := range []byte(k.ID) {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return utf8.ValidString(k.Scope) && !strings.ContainsRune(k.Scope, 0)
}

func FuzzKeyValidate(f *testing.F) {
	f.Add("", "k")
	f.Add("acct-1", " ~")
	f.Add("\x00", "k")
	f.Add("é", "\x7f")
	f.Add("\xff", "k")
	f.Add(strings.Repeat("s", 255), strings.Repeat("i", 255))
	f.Add(strings.Repeat("s", 256), "k")
	f.Add("s", strings.Repeat("i", 256))
	f.Add("s", "")
	f.Fuzz(func(t *testing.T, scope, id string) {
		k := idempotency.Key{Scope: scope, ID: id}
		err := k.Validate()
		if want := keySpec(k); want != (err == nil) {
			t.Fatalf("Key{%q, %q}.Validate() = %v; in the documented space: %v", scope, id, err, want)
		}
		if err != nil && !errors.Is(err, idempotency.ErrInvalidKey) {
			t.Fatalf("Key{%q, %q}.Validate() = %v: does not wrap ErrInvalidKey", scope, id, err)
		}
	})
}

// TestKeyValidateBoundaries checks every edge of the key space with the
// exact error.
func TestKeyValidateBoundaries(t *testing.T) {
	scope255 := strings.Repeat("é", 127) + "x" // 255 bytes of 2-byte runes and one ASCII
	for _, c := range []struct {
		scope, id string
		msg       string // "" for valid
	}{
		{"", "k", ""},
		{"", " ", ""},
		{"", "~", ""},
		{"", " !az09~", ""},
		{"", "\x1f", "id byte 0 is 0x1f, not printable ASCII"},
		{"", "ab\x7f", "id byte 2 is 0x7f, not printable ASCII"},
		{"", "a\x00", "id byte 1 is 0x00, not printable ASCII"},
		{"", "\x80", "id byte 0 is 0x80, not printable ASCII"},
		{"", "\xff", "id byte 0 is 0xff, not printable ASCII"},
		{"", "é", "id byte 0 is 0xc3, not printable ASCII"},
		{"", "", "id is empty"},
		{"", strings.Repeat("i", 255), ""},
		{"", strings.Repeat("i", 256), "id is 256 bytes, longer than 255"},
		{scope255, "k", ""},
		{scope255 + "x", "k", "scope is 256 bytes, longer than 255"},
		{"\x01\x1f\x7f\U0010FFFF", "k", ""},
		{"\x00", "k", "scope contains NUL at byte 0"},
		{"ab\x00", "k", "scope contains NUL at byte 2"},
		{"\xff", "k", "scope is not valid UTF-8"},
		{"a\xc3", "k", "scope is not valid UTF-8"},
		{"\xed\xa0\x80", "k", "scope is not valid UTF-8"},
	} {
		err := idempotency.Key{Scope: c.scope, ID: c.id}.Validate()
		switch {
		case c.msg == "" && err != nil:
			t.Errorf("Key{%q, %q}: got %v, want valid", c.scope, c.id, err)
		case c.msg != "" && (err == nil || err.Error() != "idempotency: invalid key: "+c.msg || !errors.Is(err, idempotency.ErrInvalidKey)):
			t.Errorf("Key{%q, %q}: got %v, want %s", c.scope, c.id, err, c.msg)
		}
	}
}

// TestDoValidatesFingerprint: a fingerprint is 1 to 255 bytes of 0x20 to
// 0x7E; any other is refused with ErrInvalidFingerprint before the store or
// fn is touched, and the edges themselves are accepted.
func TestDoValidatesFingerprint(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	g, err := idempotency.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		fp  string
		msg string
	}{
		{" ", ""},
		{"~", ""},
		{" ~", ""},
		{strings.Repeat("f", 255), ""},
		{"", "empty"},
		{strings.Repeat("f", 256), "256 bytes, longer than 255"},
		{"\x1f", "byte 0 is 0x1f, not printable ASCII"},
		{"ab\x7f", "byte 2 is 0x7f, not printable ASCII"},
		{"a\x00", "byte 1 is 0x00, not printable ASCII"},
		{"é", "byte 0 is 0xc3, not printable ASCII"},
	} {
		calls := 0
		key := idempotency.Key{ID: "fp-" + strings.Repeat("x", i+1)}
		resp, err := g.Do(ctx, key, c.fp, func(tx *memstore.Tx) (idempotency.Response, error) {
			calls++
			tx.Effect(key.ID)
			return idempotency.Response{Status: 201}, nil
		})
		if c.msg == "" {
			if err != nil || resp.Status != 201 || calls != 1 || s.Count(key.ID) != 1 {
				t.Errorf("fingerprint %q: got %+v, %v, %d calls, %d effects; want executed once", c.fp, resp, err, calls, s.Count(key.ID))
			}
			continue
		}
		if err == nil || err.Error() != "idempotency: invalid fingerprint: "+c.msg || !errors.Is(err, idempotency.ErrInvalidFingerprint) {
			t.Errorf("fingerprint %q: got %v, want %s", c.fp, err, c.msg)
		}
		if calls != 0 || s.Count(key.ID) != 0 {
			t.Errorf("fingerprint %q: fn ran %d times, %d effects; want none", c.fp, calls, s.Count(key.ID))
		}
	}
}

// TestDoValidatesKeyFirst: an invalid key is refused with ErrInvalidKey
// before fn runs or the store is touched.
func TestDoValidatesKeyFirst(t *testing.T) {
	s := memstore.New()
	g, err := idempotency.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []idempotency.Key{{ID: ""}, {ID: "\x7f"}, {Scope: "\x00", ID: "k"}, {ID: strings.Repeat("i", 256)}} {
		_, err := g.Do(context.Background(), k, "fp", func(tx *memstore.Tx) (idempotency.Response, error) {
			tx.Effect("ran")
			return idempotency.Response{Status: 200}, nil
		})
		if !errors.Is(err, idempotency.ErrInvalidKey) || s.Count("ran") != 0 {
			t.Errorf("%+v: got %v, %d effects; want ErrInvalidKey and none", k, err, s.Count("ran"))
		}
	}
}
