package memstore_test

import (
	"context"
	"testing"

	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/memstore"
)

// TestConformance runs the suite on the in-memory store: it proves the suite
// passes on a correct store without a server.
func TestConformance(t *testing.T) { conformance.Run(t, harness) }

// TestConformanceStepLeases runs the suite on the store holding each Phase
// by its lease alone, as a store without transactions does: the suite
// passes on a correct one (the catalogue shows it failing one whose stale
// phase still commits).
func TestConformanceStepLeases(t *testing.T) {
	h := harness
	h.NewFixture = func(t testing.TB, opts conformance.Options) conformance.Fixture[*memstore.Tx] {
		f := harness.NewFixture(t, opts)
		f.Store.(*memstore.Store).StepLeases = true
		return f
	}
	conformance.Run(t, h)
}

// BenchmarkStore measures the core's own overhead: the store does no I/O.
func BenchmarkStore(b *testing.B) { conformance.Benchmark(b, harness) }

var harness = conformance.Harness[*memstore.Tx]{
	NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*memstore.Tx] {
		s := memstore.New()
		s.Clock = opts.Clock
		return conformance.Fixture[*memstore.Tx]{
			Store:  s,
			Effect: func(_ context.Context, tx *memstore.Tx, tag string) error { tx.Effect(tag); return nil },
			Count:  func(_ context.Context, tag string) (int, error) { return s.Count(tag), nil },
			Bare:   func(context.Context, string) error { return nil },
		}
	},
}
