package idempotency_test

import (
	"errors"
	"testing"

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
		if _, err := idempotency.FingerprintJSON([]byte(in)); !errors.Is(err, idempotency.ErrInvalidJSON) {
			t.Errorf("FingerprintJSON(%q): got %v, want ErrInvalidJSON", in, err)
		}
	}
}

func TestFingerprintParts(t *testing.T) {
	if idempotency.Fingerprint([]byte("ab"), []byte("c")) == idempotency.Fingerprint([]byte("a"), []byte("bc")) {
		t.Fatal("moving bytes between parts must change the fingerprint")
	}
	if idempotency.Fingerprint([]byte("POST"), []byte("/p")) != idempotency.Fingerprint([]byte("POST"), []byte("/p")) {
		t.Fatal("fingerprint must be deterministic")
	}
}
