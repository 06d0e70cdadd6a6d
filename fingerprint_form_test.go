package idempotency_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency"
)

func TestCanonicalForm(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"amount=100&currency=usd", "amount=100&currency=usd"},
		{"currency=usd&amount=100", "amount=100&currency=usd"},
		// percent-encoding: + and %20, lower and upper hex, needless escapes
		{"name=Jane+Doe&metadata%5Border%5D=42", "metadata%5Border%5D=42&name=Jane%20Doe"},
		{"metadata[order]=4%32&name=Jane%20Doe", "metadata%5Border%5D=42&name=Jane%20Doe"},
		{"n=%c3%a9&m=%2b", "m=%2B&n=%C3%A9"},
		// repeated names keep their order; other names move around them
		{"a=2&b=x&a=1", "a=2&a=1&b=x"},
		{"a=1&b=x&a=2", "a=1&a=2&b=x"},
		// a bare name is an empty value; empty pieces go
		{"flag&&x=1&", "flag=&x=1"},
		{"=v", "=v"},
		{"%ff=%00", "%FF=%00"},
	} {
		got, err := idempotency.CanonicalForm([]byte(tc.in))
		if err != nil || string(got) != tc.want {
			t.Errorf("CanonicalForm(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestFingerprintFormValuesMatter(t *testing.T) {
	a, err := idempotency.FingerprintForm([]byte("amount=100&currency=usd&expand[]=customer&expand[]=invoice"))
	if err != nil || len(a) != 64 {
		t.Fatalf("FingerprintForm: %q, %v", a, err)
	}
	b, _ := idempotency.FingerprintForm([]byte("expand%5B%5D=customer&currency=usd&expand%5B%5D=invoice&amount=100"))
	if a != b {
		t.Fatalf("name order and percent-encoding must not matter: %s vs %s", a, b)
	}
	for _, other := range []string{
		"amount=101&currency=usd&expand[]=customer&expand[]=invoice",
		"amount=100&currency=usd&expand[]=invoice&expand[]=customer", // the values of one name in another order
		"amount=100&currency=usd&expand[]=customer",
		"amount=100&currency=usd&expand[]=customer&expand[]=invoice&expand[]=",
		"amount=100&currency=usd&expand=customer&expand=invoice",
		"amount=100&currency=usd&expand[]=customer%26expand[]%3Dinvoice",
	} {
		c, err := idempotency.FingerprintForm([]byte(other))
		if err != nil || c == a {
			t.Errorf("%s must fingerprint differently (err %v)", other, err)
		}
	}
}

func TestFingerprintFormInvalid(t *testing.T) {
	for _, in := range []string{"a=%", "a=%4", "a=%zz", "%g0=1", "a=1;b=2", "a=1&b;=2"} {
		_, err := idempotency.FingerprintForm([]byte(in))
		if !errors.Is(err, idempotency.ErrInvalidBody) {
			t.Errorf("FingerprintForm(%q): got %v, want ErrInvalidForm", in, err)
		}
		if _, refErr := url.ParseQuery(in); refErr == nil {
			t.Errorf("url.ParseQuery(%q) accepts what CanonicalForm refuses", in)
		}
	}
}

// formSeeds are one body of each shape: the form a Stripe SDK sends, the
// escapes, repeated and empty names, and the refusals.
var formSeeds = []string{
	"", "a=1", "amount=2000&currency=usd&metadata[order_id]=6735&expand[0]=customer",
	"name=Jane+Doe&name=Jane%20Doe", "b=2&a=1&b=1", "flag&&=&x", "%2B=%2b&+=%20",
	"%C3%A9=%c3%a9&%ff=%FE", "a=%", "a=%zz", "a=1;b=2", "&&&", "a==b=c",
}

func FuzzCanonicalForm(f *testing.F) {
	for _, s := range formSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkCanonicalForm(t, data)
	})
}

// checkCanonicalForm is the property FuzzCanonicalForm checks on one body:
// CanonicalForm accepts what url.ParseQuery accepts, keeps the url.Values
// it reads, is a fixed point, and gives every spelling of those values the
// same bytes.
func checkCanonicalForm(t *testing.T, data []byte) {
	t.Helper()
	got, err := idempotency.CanonicalForm(data)
	if err != nil && !errors.Is(err, idempotency.ErrInvalidBody) {
		t.Fatalf("CanonicalForm(%q): error %v does not wrap ErrInvalidForm", data, err)
	}
	if strings.Count(string(data), "&") >= 1000 {
		return // ParseQuery's limit on the number of parameters decides
	}
	ref, refErr := url.ParseQuery(string(data))
	if (err == nil) != (refErr == nil) {
		t.Fatalf("CanonicalForm(%q): error %v, url.ParseQuery: %v", data, err, refErr)
	}
	fp, fpErr := idempotency.FingerprintForm(data)
	if (fpErr == nil) != (err == nil) {
		t.Fatalf("FingerprintForm(%q): %v, CanonicalForm: %v", data, fpErr, err)
	}
	if err != nil {
		return
	}
	if sum := sha256.Sum256(got); fp != hex.EncodeToString(sum[:]) {
		t.Fatalf("FingerprintForm(%q) = %s, not the SHA-256 of %q", data, fp, got)
	}
	for _, c := range got {
		if !strings.ContainsRune("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~%=&", rune(c)) {
			t.Fatalf("CanonicalForm(%q) = %q holds the byte %q", data, got, c)
		}
	}
	back, err := url.ParseQuery(string(got))
	if err != nil || !reflect.DeepEqual(back, ref) {
		t.Fatalf("CanonicalForm(%q) = %q reads as %v (%v), the body as %v", data, got, back, err, ref)
	}
	again, err := idempotency.CanonicalForm(got)
	if err != nil || string(again) != string(got) {
		t.Fatalf("not a fixed point: CanonicalForm(%q) = %q, then %q, %v", data, got, again, err)
	}
	// Another spelling of the same values: names in reverse order,
	// escaped by net/url (spaces as +, lower-case-free %XX).
	names := make([]string, 0, len(ref))
	for n := range ref {
		names = append(names, n)
	}
	slices.Sort(names)
	slices.Reverse(names)
	var alt []string
	for _, n := range names {
		for _, v := range ref[n] {
			alt = append(alt, url.QueryEscape(n)+"="+url.QueryEscape(v))
		}
	}
	other, err := idempotency.CanonicalForm([]byte(strings.Join(alt, "&")))
	if err != nil || string(other) != string(got) {
		t.Fatalf("same values, other canonical form: %q gives %q, its respelling %q gives %q, %v",
			data, got, strings.Join(alt, "&"), other, err)
	}
}
