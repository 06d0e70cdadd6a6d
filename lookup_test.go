package idempotency_test

import (
	"errors"
	"testing"

	"github.com/go-idempotency/idempotency"
)

func TestLookupPolicyCheck(t *testing.T) {
	for _, p := range []idempotency.LookupPolicy{idempotency.LookupAdaptive, idempotency.LookupAlways, idempotency.LookupNever} {
		if err := p.Check(); err != nil {
			t.Errorf("%v.Check(): %v", p, err)
		}
	}
	for _, p := range []idempotency.LookupPolicy{-1, idempotency.LookupNever + 1} {
		if err := p.Check(); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("%v.Check(): got %v, want ErrInvalidConfig", p, err)
		}
	}
	if got := idempotency.LookupPolicy(7).String(); got != "LookupPolicy(7)" {
		t.Errorf("String of an unknown policy: %q", got)
	}
	if got := idempotency.LookupPolicy(0).String(); got != "LookupAdaptive" {
		t.Errorf("String of the zero value: %q", got)
	}
}
