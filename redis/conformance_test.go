package redis

import (
	"context"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
)

// harness builds the conformance fixtures on clients from newClient.
// Options.Lease gives a store with that lease and no renewals, so that the
// lease runs out while fn runs.
func harness(newClient func(t testing.TB) func(int) goredis.UniversalClient) conformance.Harness[*Tx] {
	return conformance.Harness[*Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*Tx] {
			cfg := &Config{Lease: opts.Lease, Clock: opts.Clock}
			clients := newClient(t)
			f := newFixture(t, clients, opts.MaxConns, cfg)
			f.store.noRenew = opts.Lease > 0
			// Another store on the same prefix, with a client of its own:
			// another process of the service.
			reopen := func(context.Context) (idempotency.KeyStore[*Tx], error) {
				client := clients(opts.MaxConns)
				t.Cleanup(func() { _ = client.Close() })
				c := Config{Prefix: f.prefix, Lease: cfg.Lease, Clock: cfg.Clock}
				s, err := New(client, &c)
				if err != nil {
					return nil, err
				}
				s.noRenew = opts.Lease > 0
				return s, nil
			}
			return conformance.Fixture[*Tx]{Store: f.store, Effect: f.effect, Count: f.count, Bare: f.bare, Fill: f.fill, Reopen: reopen}
		},
		// Completed records expire by themselves; Purge returns 0. A
		// reservation is a lease that runs out if it is not renewed.
		Features: conformance.Features{SelfExpiring: true, Leases: true},
	}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, harness(singleClient))
}
