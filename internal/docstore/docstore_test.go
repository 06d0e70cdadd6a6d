package docstore

import (
	"context"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
)

// TestConformance runs the shared suite on the in-memory store written from
// the documentation.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Harness[*LogTx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*LogTx] {
			s := New(Config{Clock: opts.Clock, Lease: opts.Lease, MaxConns: opts.MaxConns})
			return conformance.Fixture[*LogTx]{
				Store: s,
				Effect: func(_ context.Context, tx *LogTx, tag string) error {
					return tx.Append(tag)
				},
				Count: func(_ context.Context, tag string) (int, error) {
					return s.Count(tag), nil
				},
				Reopen: func(context.Context) (idempotency.KeyStore[*LogTx], error) {
					return s.Reopen(), nil
				},
				// The store judges every hold and expiry by the server's
				// clock (the shared map's, or the test clock), never by the
				// host's: an instance on a host an hour off ignores its clock.
				ReopenAt: func(_ context.Context, _ func() time.Time) (idempotency.KeyStore[*LogTx], error) {
					return s.Reopen(), nil
				},
			}
		},
		Features: conformance.Features{Leases: true},
	})
}
