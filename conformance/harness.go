// Package conformance is the shared test suite for [idempotency.KeyStore]
// implementations. Every backend of this module runs it, and third parties
// can run it against their own:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Harness[*sql.Tx]{
//			NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*sql.Tx] { ... },
//		})
//	}
//
// Each case gets a fresh fixture (its own table or key prefix). It releases
// its concurrent callers together through a start gate. It runs under a
// watchdog, so a deadlock fails the case instead of hanging the run. A case
// that checks a rule of the contract (the doc comments of
// [idempotency.KeyStore] and [backend.Txn]) logs, when it fails, the
// sentence it checks, as [testing/slogtest] does.
//
// Beyond the happy paths, the suite:
//
//   - interrupts Complete at many moments of its measured duration, and
//     requires the effect and the answer to be committed together or not
//     at all;
//   - lets a short lease run out while fn runs (stores with
//     [Features].Leases), and requires the stale owner's Complete to be
//     refused;
//   - checks TTLs counted from completion, clock and TTL extremes,
//     byte-exact headers, record ownership, in-memory waiting and the
//     bound on waits in the store;
//   - checks expiry on the store's own clock too (TTLExpiryStoreClock), so
//     that a store that expires records only under a test clock fails,
//     and a store that cannot take a test clock ([Features].NoClock,
//     [Features].ExpiryGranularity) is still checked;
//   - checks every optional interface the store implements:
//     [backend.Stepper] (including a phase whose lease runs out while
//     it is open), [backend.KeyAdmin], [backend.KeyLister],
//     [backend.QuotaCounter] (atomic admissions, free replays, refusals
//     that count nothing) and [backend.Migrator]; the cases of an
//     interface the store lacks are skipped, naming it;
//   - runs instances of the store on hosts whose clocks are an hour apart
//     when the fixture sets [Fixture].ReopenAt, and lets a holder die with
//     its lease held (LeaseHolderDies).
//
// docs/backends.md lists every case, the leases and TTLs it uses and the
// clocks it drives; [Features] says what a store may declare it cannot do,
// and which rule the suite then checks instead.
//
// A store that reserves the key in one transaction and commits the effect
// in another fails the suite.
//
// Callers of one key race through several Guards and, when the fixture
// sets [Fixture].Reopen, several instances of the store. So the store
// itself sees concurrent Reserves of one free key; one Guard would queue
// them in memory. Lease stores meet racing takers of a lapsed lease, a
// waiter already waiting when it runs out, and a stale owner's Rollback and
// Complete; Purge meets keys re-reserved while it runs, an exact limit, and
// a count checked against what it deleted. The package's own tests run the
// suite on a catalogue of deliberately broken stores, one per mistake, and
// show each failing the case made for it. A store that misbehaves from its
// goroutines (reports after its case ended, a call that never returns)
// fails its case and never crashes the test binary.
package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// Fixture is one fresh, isolated store plus a way to perform and count an
// effect inside the store's transaction.
type Fixture[Tx any] struct {
	// Store is the store under test; it sees no keys of other fixtures.
	Store idempotency.KeyStore[Tx]
	// Effect performs one effect through tx, labelled with tag (for
	// example, inserts one row (tag) into an effects table of the fixture).
	// It is called from many goroutines at once.
	Effect func(ctx context.Context, tx Tx, tag string) error
	// Count reports how many effects labelled tag are committed, read
	// through a connection of its own (not inside any Tx).
	Count func(ctx context.Context, tag string) (int, error)
	// Reopen, if not nil, opens another instance of the store on the same
	// records, as another process of the service would. The instance uses
	// the same table or key prefix, and a pool or client of its own. It registers its cleanup
	// with the fixture's t. The cases of racing callers then spread them
	// over several instances, so that Reserve calls for one free key meet
	// in the database and not in one process's memory. Effect and Count
	// work with the transactions of every instance.
	Reopen func(ctx context.Context) (idempotency.KeyStore[Tx], error)
	// ReopenAt, if not nil, opens another instance as Reopen does, on a
	// host whose clock reads hostClock: wherever that instance reads the
	// application host's clock (time.Now: to write a lease's end or a
	// CreatedAt, to judge a hold, to time a wait), it reads hostClock
	// instead. The store's own clock (the database server's) is not
	// changed. The case HostClocksDiffer opens instances whose clocks are
	// an hour apart ([Features].ClockSkew if set), as the contract allows,
	// and requires them to agree on every hold and every record. A fixture
	// whose store never reads the host's clock may leave it nil; the case
	// is then skipped, naming this field.
	ReopenAt func(ctx context.Context, hostClock func() time.Time) (idempotency.KeyStore[Tx], error)
	// Bare, used only by [Benchmark], performs the same effect as Effect in
	// a plain transaction of the same pool, with no idempotency: the
	// baseline every benchmark is compared with. Nil skips the benchmarks.
	Bare func(ctx context.Context, tag string) error
	// Fill, used only by [BenchmarkScale], writes n completed records
	// straight into the store (bulk SQL, not through Do), with ids that no
	// benchmark key uses, all expiring at expiresAt. Nil skips the scale
	// benchmarks.
	Fill func(ctx context.Context, n int, expiresAt time.Time) error
}

// Options shape a fixture for one case.
type Options struct {
	// MaxConns, when > 0, caps the store's connection pool at that many
	// connections (the suite uses 2 to prove that no call asks for a
	// second connection while holding one). For a client that multiplexes
	// every call over one connection (gRPC, HTTP/2), it caps the calls in
	// flight: the fixture admits at most MaxConns requests outstanding at
	// once, for example with a semaphore around the client.
	MaxConns int
	// Lease, when > 0, asks for a store whose lease on a held key is this
	// long. The lease runs out this long after it was taken, whatever fn
	// does (no renewal), so that fn can outlive it. Only the cases that
	// need it set it, and only when [Features].Leases is true: 300 ms
	// (LeaseRunsOut), 400 ms (LeaseTakeover, LeaseHolderDies), 1 s
	// (LeaseStaleRollback, LeaseStaleComplete, HostClocksDiffer), 2 s
	// (CompleteInterrupted, the rollback cases) and 30 s
	// (FailedCompleteFreesKey), each at least [Features].MinLease. Leases
	// run on the store's own clock, never on [Options].Clock: a test clock
	// drives expiries and the leases of [backend.Stepper] phases, not
	// the hold of a reservation. Zero: the store's own default lease (a
	// store's default is its production value, such as redis's 30 s), or
	// no lease at all on a store that holds keys in transactions.
	Lease time.Duration
	// Clock, when non-nil, is the test clock the fixture passes to its
	// store. The store then reads it instead of its own clock wherever it
	// judges or stores a time (expiry, creation, Purge). The time cases
	// drive time through it: TTLs counted from completion, TTL and clock
	// extremes, sub-millisecond expiries, Purge. A fixture whose store
	// cannot take a test clock sets [Features].NoClock, and those cases are
	// skipped, naming that flag. Nil: the store's own clock.
	Clock func() time.Time
}

// Features says, honestly, what a backend guarantees. The suite adapts the
// cases that depend on a feature and skips, naming the flag, the ones a
// backend cannot pass by design.
type Features struct {
	// SerialWriters is true when the store runs one write transaction at a
	// time for the whole database (SQLite): a caller holding one key then
	// delays callers of other keys too.
	SerialWriters bool
	// SelfExpiring is true when the store deletes expired records by
	// itself (Redis key expiry) and [idempotency.KeyStore.Purge] always
	// returns 0. Otherwise Purge must delete exactly the expired keys.
	SelfExpiring bool
	// Leases is true when the store holds a key by a lease that can run
	// out while fn runs (Redis). Another caller may then take the key, and
	// the first owner's Complete must be refused. The fixture must honour
	// [Options].Lease. A store that holds keys in a database transaction
	// leaves it false.
	Leases bool
	// NoClock is true when the fixture cannot honour [Options].Clock: its
	// store judges expiry by a clock or a mechanism it cannot be handed (a
	// store with no clock it can read, such as etcd, whose leases the
	// server counts down). The cases that drive time through a test clock
	// are then skipped, naming this flag, and the real-clock cases check
	// the same rules on the store's own clock: TTLExpiryStoreClock (a
	// record replays until its TTL has passed, then counts as new, and
	// Purge deletes it), StepsHoldRunsOutMidStep and the lease cases.
	NoClock bool
	// ExpiryGranularity, when > 0, is the precision of the store's own
	// expiry mechanism when it cannot keep an instant to the millisecond
	// (an etcd lease lasts whole seconds). The store rounds every TTL and
	// lease it sets up to a multiple of it, never down: a record lasts at
	// least its TTL and at most one ExpiryGranularity longer. The
	// test-clock cases are then skipped as with NoClock;
	// TTLExpiryStoreClock uses a TTL of one and a half granularities and
	// requires a replay until the TTL has passed, and every lease bound of
	// the suite is lengthened by one granularity.
	ExpiryGranularity time.Duration
	// MinLease, when > 0, is the shortest lease the store can hold (an
	// etcd lease lasts at least about 1.5x the cluster's election timeout).
	// Every lease the suite asks for ([Options].Lease, a Phase's
	// [backend.Acquisition].Lease in StepsHoldRunsOutMidStep) is then
	// at least MinLease, rounded up to ExpiryGranularity.
	MinLease time.Duration
	// ClockSkew, when > 0, is the largest disagreement between the clocks
	// of two hosts that the store tolerates: a store with no clock it can
	// read that judges expiry by comparing an instant written by one host
	// with another host's clock. HostClocksDiffer then runs its instances
	// ClockSkew apart instead of an hour. A store that judges every hold
	// and expiry by the store's clock, or by durations, leaves it 0.
	ClockSkew time.Duration
	// MultiPrimary is true when the fixture's calls go to several primaries
	// that certify transactions at commit (Galera, MySQL Group Replication
	// in multi-primary mode). Callers of one free key on two nodes can both
	// obtain a Txn and run fn, and only one of them commits. The other's
	// Complete fails with [backend.ErrConflict], nothing of it
	// committed, and its retry replays the winner's answer. The racing
	// cases then require one committed effect and identical answers, not
	// one run of fn. (fn's writes through tx are safe there; anything else
	// fn does may happen once per node that ran it.)
	MultiPrimary bool
}

// Harness tells [Run] how to build fixtures for a backend.
type Harness[Tx any] struct {
	// NewFixture returns a fresh, isolated fixture and registers its
	// cleanup with t.Cleanup. It may call t.Fatal/t.Skip.
	NewFixture func(t testing.TB, opts Options) Fixture[Tx]
	// Features of the backend.
	Features Features
}
