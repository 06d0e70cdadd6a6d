// Package readmekit checks the README's quick starts, which every store
// package runs against its server: the same promise, checked one way.
//
// It imports "testing", so only _test.go files may import it.
package readmekit

import (
	"errors"
	"testing"

	"github.com/go-idempotency/idempotency"
)

// Pay runs a quick start once: a payment of amount, fingerprinted fp, under
// the key the caller chose.
type Pay func(fp string, amount int) (idempotency.Response, error)

// CheckQuickStart calls pay twice with one request, then once with another
// amount under the same key. The first call must answer 201, the second
// must replay the same bytes, and the third must fail with
// [idempotency.ErrMismatch]. It returns the first response, for the caller
// to check the one effect against.
func CheckQuickStart(t testing.TB, pay Pay) idempotency.Response {
	t.Helper()
	fp, err := idempotency.FingerprintJSON([]byte(`{"amount":1999}`))
	if err != nil {
		t.Fatal(err)
	}
	first, err := pay(fp, 1999)
	if err != nil {
		t.Fatal(err)
	}
	second, err := pay(fp, 1999)
	if err != nil {
		t.Fatal(err)
	}
	if first.Status != 201 || first.Replayed || second.Status != 201 || !second.Replayed || string(second.Body) != string(first.Body) {
		t.Errorf("first %d %q replayed %v, second %d %q replayed %v; want 201, then the same bytes replayed",
			first.Status, first.Body, first.Replayed, second.Status, second.Body, second.Replayed)
	}
	other, err := idempotency.FingerprintJSON([]byte(`{"amount":2000}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pay(other, 2000); !errors.Is(err, idempotency.ErrMismatch) {
		t.Errorf("same key, other amount: %v, want ErrMismatch", err)
	}
	return first
}
