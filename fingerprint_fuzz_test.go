package idempotency_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency"
)

// checkCanonical is the property FuzzCanonicalJSON checks on one input.
func checkCanonical(t *testing.T, data []byte) {
	t.Helper()
	ref, refErr := refParse(data)
	got, err := idempotency.CanonicalJSON(data)
	if err != nil && !errors.Is(err, idempotency.ErrInvalidBody) {
		t.Fatalf("CanonicalJSON(%q): error %v does not wrap ErrInvalidJSON", data, err)
	}
	if errors.Is(refErr, errRefDepth) {
		return // encoding/json's own depth limit decides
	}
	if (err == nil) != (refErr == nil) {
		t.Fatalf("CanonicalJSON(%q): error %v, reference parser: %v", data, err, refErr)
	}
	fp, fpErr := idempotency.FingerprintJSON(data)
	if (fpErr == nil) != (err == nil) {
		t.Fatalf("FingerprintJSON(%q): %v, CanonicalJSON: %v", data, fpErr, err)
	}
	if err != nil {
		return
	}
	if sum := sha256.Sum256(got); fp != hex.EncodeToString(sum[:]) {
		t.Fatalf("FingerprintJSON(%q) = %s, not the SHA-256 of %q", data, fp, got)
	}
	if !json.Valid(got) {
		t.Fatalf("CanonicalJSON(%q) = %q: not valid JSON", data, got)
	}
	if len(got) > 3*len(data)+3 {
		t.Fatalf("CanonicalJSON(%q) = %d bytes from %d", data, len(got), len(data))
	}
	again, err := idempotency.CanonicalJSON(got)
	if err != nil || !bytes.Equal(again, got) {
		t.Fatalf("not a fixed point: CanonicalJSON(%q) = %q, then %q, %v", data, got, again, err)
	}
	back, err := refParse(got)
	if err != nil || !refEqual(ref, back) {
		t.Fatalf("CanonicalJSON(%q) = %q changes the value (reference: %v)", data, got, err)
	}
	var alt strings.Builder
	refRender(&alt, ref)
	other, err := idempotency.CanonicalJSON([]byte(alt.String()))
	if err != nil || !bytes.Equal(other, got) {
		t.Fatalf("same value, other canonical form: %q gives %q, its respelling %q gives %q, %v", data, got, alt.String(), other, err)
	}
}

// canonicalSeeds are the seeds of both targets: the collision classes found
// so far, and one text of each shape.
var canonicalSeeds = []string{
	`10e9223372036854775807`, `1e-9223372036854775808`,
	`0.1e-9223372036854775808`, `1e9223372036854775807`,
	`12e9223372036854775807`, `1e99999999999999999999999`, `-1E+0099999999999999999999`,
	`1e999999999`, `0.000e-99999999999999999999`, `9007199254740993`, `9007199254740992`,
	`"\ud800"`, `"\udc00"`, `"\ufffd"`, "\"\xff\"", "\"\xed\xa0\x80\"", `"\ud83d\ude00"`, `"😀"`,
	`{"a":1,"b":[true,false,null,"x\u0000y"],"c":{"d":-0.50e+1}}`,
	`[1,1.0,10e-1,0.1E1,100,1e2]`, `"\u2028\u2029\b\f\n\r\t\"\\\/<>&"`,
	`{"\u00e9":1,"é":2}`, `{"a":1,"a":1}`, ` [ ] `, `{}`, `01`, `1.`, `-`, `[1,]`, `{"a" 1}`,
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range canonicalSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkCanonical(t, data)
	})
}

func FuzzFingerprintCollision(f *testing.F) {
	pairs := [][2]string{
		{`10e9223372036854775807`, `1e-9223372036854775808`},
		{`0.1e-9223372036854775808`, `1e9223372036854775807`},
		{`"\ud800"`, `"\udc00"`},
		{"\"\xff\"", `"\ufffd"`},
		{`{"a":1,"b":2}`, `{"b":2.0,"a":10e-1}`},
		{`9007199254740993`, `9007199254740992`},
		{`[1e400]`, `[1e401]`},
		{`{"a":"\u00e9"}`, `{"a":"é"}`},
	}
	for _, p := range pairs {
		f.Add([]byte(p[0]), []byte(p[1]))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		fa, errA := idempotency.FingerprintJSON(a)
		fb, errB := idempotency.FingerprintJSON(b)
		ra, refErrA := refParse(a)
		rb, refErrB := refParse(b)
		if errA != nil || errB != nil || refErrA != nil || refErrB != nil {
			return // acceptance is FuzzCanonicalJSON's business
		}
		if same := refEqual(ra, rb); same != (fa == fb) {
			t.Fatalf("%q and %q: equal values %v, equal fingerprints %v (%s, %s)", a, b, same, fa == fb, fa, fb)
		}
	})
}
