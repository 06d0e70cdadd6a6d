package backend_test

import (
	"errors"
	"testing"

	"github.com/go-idempotency/idempotency/backend"
)

func TestLookupPolicyCheck(t *testing.T) {
	for _, p := range []backend.LookupPolicy{backend.LookupAdaptive, backend.LookupAlways, backend.LookupNever} {
		if err := p.Validate(); err != nil {
			t.Errorf("%v.Check(): %v", p, err)
		}
	}
	for _, p := range []backend.LookupPolicy{-1, backend.LookupNever + 1} {
		if err := p.Validate(); !errors.Is(err, backend.ErrInvalidConfig) {
			t.Errorf("%v.Check(): got %v, want ErrInvalidConfig", p, err)
		}
	}
	if got := backend.LookupPolicy(7).String(); got != "LookupPolicy(7)" {
		t.Errorf("String of an unknown policy: %q", got)
	}
	if got := backend.LookupPolicy(0).String(); got != "LookupAdaptive" {
		t.Errorf("String of the zero value: %q", got)
	}
}
