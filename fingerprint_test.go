package idempotency_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

func TestCanonicalJSON(t *testing.T) {
	same := [][]string{
		{`{"orderId":1,"amount":100}`, "{ \"amount\" : 100 ,\n\t\"orderId\": 1 }", `{"amount":1e2,"orderId":1.0}`, `{"amount":100.00,"orderId":10E-1}`},
		{`["a","\u00e9",true,null]`, `[ "a" , "é", true, null ]`},
		{`{"s":"<&>"}`, `{"s":"\u003c\u0026\u003e"}`},
		{`0`, `-0`, `0.0e5`},
		{`{"a":{"y":[1,2],"x":"z"}}`, `{"a":{"x":"z","y":[1,2]}}`},
	}
	for _, group := range same {
		want, err := idempotency.CanonicalJSON([]byte(group[0]))
		if err != nil {
			t.Fatalf("%s: %v", group[0], err)
		}
		for _, in := range group[1:] {
			got, err := idempotency.CanonicalJSON([]byte(in))
			if err != nil || string(got) != string(want) {
				t.Errorf("CanonicalJSON(%s) = %s, %v; want %s", in, got, err, want)
			}
		}
	}
	got, _ := idempotency.CanonicalJSON([]byte(`{"orderId": 1, "amount": 100, "note": "<é>"}`))
	if want := `{"amount":1e2,"note":"<é>","orderId":1e0}`; string(got) != want {
		t.Errorf("canonical form: got %s, want %s", got, want)
	}
}

func TestFingerprintJSONValuesMatter(t *testing.T) {
	a, _ := idempotency.FingerprintJSON([]byte(`{"orderId":1,"amount":100}`))
	b, _ := idempotency.FingerprintJSON([]byte(`{"amount": 100, "orderId": 1}`))
	if a != b || len(a) != 64 {
		t.Fatalf("key order and whitespace must not matter: %s vs %s", a, b)
	}
	for _, other := range []string{`{"orderId":1,"amount":101}`, `{"orderId":1,"amount":"100"}`, `{"orderId":1}`, `{"orderId":1,"amount":100,"x":null}`, `[1,100]`} {
		c, err := idempotency.FingerprintJSON([]byte(other))
		if err != nil || c == a {
			t.Errorf("%s must fingerprint differently (err %v)", other, err)
		}
	}
}

func TestFingerprintJSONInvalid(t *testing.T) {
	for _, in := range []string{``, `{`, `{"a":1}x`, `{"a":1} {"b":2}`, `{'a':1}`, `{"a":1,"a":2}`, `[{"k":1,"k":1}]`, `01`, `NaN`} {
		if _, err := idempotency.FingerprintJSON([]byte(in)); !errors.Is(err, idempotency.ErrInvalidBody) {
			t.Errorf("FingerprintJSON(%q): got %v, want ErrInvalidJSON", in, err)
		}
	}
}

func TestFingerprintParts(t *testing.T) {
	if idempotency.Fingerprint([]byte("ab"), []byte("c")) == idempotency.Fingerprint([]byte("a"), []byte("bc")) {
		t.Fatal("moving bytes between parts must change the fingerprint")
	}
	first := idempotency.Fingerprint([]byte("POST"), []byte("/p"))
	if again := idempotency.Fingerprint([]byte("POST"), []byte("/p")); first != again {
		t.Fatal("fingerprint must be deterministic")
	}
}

// TestCanonicalNumbers pins the canonical form of numbers, large exponents
// included: every exponent is exact, none wraps around or is refused.
func TestCanonicalNumbers(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`0`, `0`}, {`-0`, `0`}, {`-0.000e-5`, `0`}, {`0e99999999999999999999999`, `0`},
		{`1`, `1e0`}, {`-5`, `-5e0`}, {`10`, `1e1`}, {`100.00`, `1e2`}, {`0.0012`, `1.2e-3`},
		{`123.4500e-2`, `1.2345e0`}, {`1.5E3`, `1.5e3`}, {`1.5e+3`, `1.5e3`}, {`-2.50e-001`, `-2.5e-1`},
		{`9007199254740993`, `9.007199254740993e15`},
		// Exponent overflows that once collided: each was written as another.
		{`10e9223372036854775807`, `1e9223372036854775808`},
		{`1e-9223372036854775808`, `1e-9223372036854775808`},
		{`0.1e-9223372036854775808`, `1e-9223372036854775809`},
		{`12e9223372036854775807`, `1.2e9223372036854775808`},
		{`1e9223372036854775807`, `1e9223372036854775807`},
		// Exponents of 19 digits and more are added to on their digits.
		{`1e9999999999999999999`, `1e9999999999999999999`},
		{`1E+0099999999999999999999`, `1e99999999999999999999`},
		{`10e1999999999999999999`, `1e2000000000000000000`},       // carry out of the low 18 digits
		{`99e9999999999999999999`, `9.9e10000000000000000000`},    // carry through every digit
		{`0.1e2000000000000000001`, `1e2000000000000000000`},      // low digits become 0: no borrow
		{`0.1e1000000000000000000`, `1e999999999999999999`},       // borrow empties the high digits
		{`0.1e100000000000000000000`, `1e99999999999999999999`},   // borrow through zeros
		{`10e-1000000000000000000`, `1e-999999999999999999`},      // negative: the shift subtracts
		{`0.001e-9999999999999999999`, `1e-10000000000000000002`}, // negative: the shift adds
		{`-123.0e-1000000000000000000000`, `-1.23e-999999999999999999998`},
	} {
		got, err := idempotency.CanonicalJSON([]byte(c.in))
		if err != nil || string(got) != c.want {
			t.Errorf("CanonicalJSON(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
}

// TestCanonicalNumberHugeExponentIsCheap: an exponent is never expanded,
// and its digits are added to in linear time (math/big takes seconds on a
// 1 MiB exponent).
func TestCanonicalNumberHugeExponentIsCheap(t *testing.T) {
	in := []byte(`[1e999999999,0.1e` + strings.Repeat("9", 1<<20) + `]`)
	start := time.Now()
	got, err := idempotency.CanonicalJSON(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := `[1e999999999,1e` + strings.Repeat("9", 1<<20-1) + `8]`; string(got) != want {
		t.Fatalf("got %d bytes %.40q..., want %d bytes", len(got), got, len(want))
	}
	// math/big takes over 5 s here on a quiet host, minutes under -race;
	// the bound only has to tell linear from that on a loaded CI host.
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("took %v", d)
	}
}

// TestCanonicalStrings pins the one escaping of strings.
func TestCanonicalStrings(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`"\"\\\/"`, `"\"\\/"`},
		{`"\b\f\n\r\t"`, `"\b\f\n\r\t"`},
		{`"\u0008\u000C\u000a\u000D\u0009"`, `"\b\f\n\r\t"`},
		{`"\u0000\u0001\u001f\u001F"`, `"\u0000\u0001\u001f\u001f"`},
		{`"\u0020 ~\u007e\u007f` + "\x7f" + `"`, "\"  ~~\x7f\x7f\""},
		{`"<&>\u003c\u0026\u003e"`, `"<&><&>"`},
		{`"\u00e9é\u20ac€"`, `"éé€€"`},
		{"\"\u2028a\u2029b\\u2028c\\u2029\"", `"\u2028a\u2029b\u2028c\u2029"`},
		{"\"\u2027\u202a\"", "\"\u2027\u202a\""},
		{`"\ud83d\ude00\uD83D\uDE00😀"`, `"😀😀😀"`},
		{`"\ud800\udc00\udbff\udfff"`, "\"\U00010000\U0010ffff\""},
		{`"\\u0041"`, `"\\u0041"`},
	} {
		got, err := idempotency.CanonicalJSON([]byte(c.in))
		if err != nil || string(got) != c.want {
			t.Errorf("CanonicalJSON(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	// Every ASCII character, alone in a string given as a \u escape.
	for r := rune(0); r < 0x80; r++ {
		want := string(r)
		switch {
		case r == '"' || r == '\\':
			want = `\` + want
		case strings.ContainsRune("\b\f\n\r\t", r):
			want = map[rune]string{'\b': `\b`, '\f': `\f`, '\n': `\n`, '\r': `\r`, '\t': `\t`}[r]
		case r < 0x20:
			want = fmt.Sprintf(`\u%04x`, r)
		}
		got, err := idempotency.CanonicalJSON(fmt.Appendf(nil, `"\u%04X"`, r))
		if err != nil || string(got) != `"`+want+`"` {
			t.Errorf("U+%04X: got %s, %v; want %q", r, got, err, `"`+want+`"`)
		}
	}
}

// TestCanonicalJSONRefusesInvalidText: bytes that are not UTF-8 and
// unpaired surrogate escapes used to become U+FFFD, so that different
// requests shared a fingerprint.
func TestCanonicalJSONRefusesInvalidText(t *testing.T) {
	for _, c := range []struct{ in, msg string }{
		{`"\ud800"`, "unpaired UTF-16 surrogate escape at byte 1"},
		{`"\uDBFF"`, "unpaired UTF-16 surrogate escape at byte 1"},
		{`"\ud9ff"`, "unpaired UTF-16 surrogate escape at byte 1"},
		{`"\uD9FF"`, "unpaired UTF-16 surrogate escape at byte 1"},
		{`"\udc00"`, "unpaired UTF-16 surrogate escape at byte 1"},
		{`"\uDFFF"`, "unpaired UTF-16 surrogate escape at byte 1"},
		{`"\udc00\udc00"`, "unpaired UTF-16 surrogate escape at byte 1"},
		{`["a","\ud800\ud800"]`, "unpaired UTF-16 surrogate escape at byte 6"},
		{`"\ud800\u0041"`, "unpaired UTF-16 surrogate escape at byte 1"},
		{`"\ud800\ue000"`, "unpaired UTF-16 surrogate escape at byte 1"},
		{`"\udbff\udbff\udfff"`, "unpaired UTF-16 surrogate escape at byte 1"},
		{`"\ud800\\udc00"`, "unpaired UTF-16 surrogate escape at byte 1"},
		{`"\ud800x\udc00"`, "unpaired UTF-16 surrogate escape at byte 1"},
		{`{"k\udfff":1}`, "unpaired UTF-16 surrogate escape at byte 3"},
		{`"\ud83d\ude00\ud83d"`, "unpaired UTF-16 surrogate escape at byte 13"},
		{"\"\xff\"", "not valid UTF-8"},
		{"\"\xed\xa0\x80\"", "not valid UTF-8"}, // a surrogate encoded in UTF-8
		{"{\"\xff\":1,\"\xfe\":2}", "not valid UTF-8"},
		{"\"\xc3\"", "not valid UTF-8"},
	} {
		_, err := idempotency.CanonicalJSON([]byte(c.in))
		if want := "idempotency: invalid JSON: " + c.msg; err == nil || err.Error() != want || !errors.Is(err, idempotency.ErrInvalidBody) {
			t.Errorf("CanonicalJSON(%q): got %v, want %s", c.in, err, want)
		}
	}
}

// TestCanonicalJSONLayout pins the whole output: separators, order, nesting.
func TestCanonicalJSONLayout(t *testing.T) {
	in := " { \"b\" : [ 1 , [ ] , { } , true , false , null ] ,\n\"a\":{\"y\":\"2\",\"x\":[-1.0]},\"\":0,\"é\":1,\"z\":2 } \r\n"
	want := `{"":0,"a":{"x":[-1e0],"y":"2"},"b":[1e0,[],{},true,false,null],"z":2e0,"é":1e0}`
	got, err := idempotency.CanonicalJSON([]byte(in))
	if err != nil || string(got) != want {
		t.Fatalf("got %s, %v; want %s", got, err, want)
	}
	for _, in := range []string{`[1 2]`, `{"a":1 "b":2}`, `{"a":1,}`, `{"a",1}`, `[1]]`, `{}}`, `1e`, `.5`, `+1`, "\"a\x01\""} {
		if _, err := idempotency.CanonicalJSON([]byte(in)); !errors.Is(err, idempotency.ErrInvalidBody) {
			t.Errorf("CanonicalJSON(%q): got %v, want ErrInvalidJSON", in, err)
		}
	}
}

// TestFingerprintJSONIsSHA256OfCanonical pins the fingerprint's bytes.
func TestFingerprintJSONIsSHA256OfCanonical(t *testing.T) {
	got, err := idempotency.FingerprintJSON([]byte(`{"b": 10, "a": "x"}`))
	sum := sha256.Sum256([]byte(`{"a":"x","b":1e1}`))
	if err != nil || got != hex.EncodeToString(sum[:]) {
		t.Fatalf("got %s, %v", got, err)
	}
	if fp, err := idempotency.FingerprintJSON([]byte(`{`)); fp != "" || !errors.Is(err, idempotency.ErrInvalidBody) {
		t.Fatalf("invalid JSON: got %q, %v", fp, err)
	}
}

// TestFingerprintPartsBytes pins Fingerprint's encoding: each part is
// preceded by its length as 8 big-endian bytes.
func TestFingerprintPartsBytes(t *testing.T) {
	h := sha256.New()
	h.Write([]byte{0, 0, 0, 0, 0, 0, 0, 4})
	h.Write([]byte("POST"))
	h.Write([]byte{0, 0, 0, 0, 0, 0, 0, 0})
	h.Write([]byte{0, 0, 0, 0, 0, 0, 1, 0})
	h.Write(bytes.Repeat([]byte{'x'}, 256))
	if got, want := idempotency.Fingerprint([]byte("POST"), nil, bytes.Repeat([]byte{'x'}, 256)), hex.EncodeToString(h.Sum(nil)); got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if got, want := idempotency.Fingerprint(), hex.EncodeToString(sha256.New().Sum(nil)); got != want {
		t.Fatalf("no parts: got %s, want %s", got, want)
	}
}
