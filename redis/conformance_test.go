package redis

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testenv"
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

// BenchmarkStore runs the shared benchmarks on a single Redis node; the
// bare effect is one INCR in a plain MULTI/EXEC on the same client.
func BenchmarkStore(b *testing.B) {
	conformance.Benchmark(b, harness(singleClient))
}

// BenchmarkScale runs the shared scale benchmarks: NewKeyFull works among a
// million completed records. PurgeUnderLoad is skipped: Redis deletes
// expired records by itself and Purge returns 0.
func BenchmarkScale(b *testing.B) {
	conformance.BenchmarkScale(b, harness(singleClient))
}

// faultLease is the fault fixtures' lease: a holder that vanished behind a
// partition (nothing reaches Redis, not even its release) holds its key
// until the lease runs out. It is longer than the bound after an ordinary
// fault, so that a key held until its lease runs out fails that bound.
const faultLease = 4 * time.Second

// TestFaults runs the fault-injection suite (a cut connection, a lost
// reply, a partition and a slow step at every round trip of a call) on a
// warm and on a cold pool (see conformance.RunFaultsWarmAndCold), on a
// client with ContextTimeoutEnabled: without it go-redis ignores the
// caller's context deadline on the socket, and a lost reply holds Do for
// ReadTimeout (3s by default) whatever the deadline.
func TestFaults(t *testing.T) {
	upstream := testenv.RedisAddr(t)
	conformance.RunFaultsWarmAndCold(t, conformance.FaultHarness[*Tx]{
		Upstream: upstream,
		NewFixture: func(t testing.TB, addr, ns string) conformance.Fixture[*Tx] {
			return faultFixture(t, addr, ns, addr == upstream)
		},
		CallTimeout:    time.Second,
		Bound:          3 * time.Second,
		PartitionBound: faultLease + 1500*time.Millisecond,
	})
}

// faultFixture is a store under the prefix faults:<ns>: whose effects are
// increments of a counter per tag in the hash faults:<ns>:fx, queued on
// the Tx, on a client that dials addr. The fixture on the server itself
// (owner) deletes the counters at cleanup.
func faultFixture(t testing.TB, addr, ns string, owner bool) conformance.Fixture[*Tx] {
	t.Helper()
	client := goredis.NewClient(&goredis.Options{Addr: addr, DialTimeout: 2 * time.Second, PoolSize: 4, ContextTimeoutEnabled: true})
	prefix := "faults:" + ns + ":"
	effects := prefix + "fx"
	store, err := New(client, &Config{Prefix: prefix, Lease: faultLease})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if owner {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = client.Del(ctx, effects).Err()
		}
		_ = client.Close()
	})
	return conformance.Fixture[*Tx]{
		Store: &settledStore{Store: store},
		Effect: func(ctx context.Context, tx *Tx, tag string) error {
			return tx.HIncrBy(ctx, effects, tag, 1).Err()
		},
		Count: func(ctx context.Context, tag string) (int, error) {
			n, err := client.HGet(ctx, effects, tag).Int()
			if errors.Is(err, goredis.Nil) {
				return 0, nil
			}
			return n, err
		},
	}
}

// settledStore is a Store whose Reserve, when no other Reserve of it is
// running, first lets the connections that earlier calls pinned go back to
// the pool (each goes back on a goroutine of its own, after the call
// returned; see pinned.release). The fault suite traces one call on a warm
// pool and then expects every scenario to take the same steps: without
// this, a call right after the warm-up may find its connection not back
// yet, dial one more, and trace a handshake that later calls do not send.
type settledStore struct {
	*Store
	active atomic.Int32
}

func (s *settledStore) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*Tx], *backend.Record, error) {
	if s.active.Add(1) == 1 {
		for end := time.Now().Add(200 * time.Millisecond); s.pins.Load() > 0 && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
	}
	defer s.active.Add(-1)
	return s.Store.Reserve(ctx, r)
}
