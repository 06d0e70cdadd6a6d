package idempotency

import (
	"context"

	"github.com/go-idempotency/idempotency/backend"
)

// KeyStore is the storage a [Guard] runs on. Tx is the backend's native
// transaction handle (pgx.Tx, *sql.Tx, a Redis pipeline): the caller's effect
// runs on the very transaction that holds the key.
//
// The core owns the protocol: validation, fingerprint comparison, retries of
// [backend.ErrConflict], the observer. A backend owns its transaction type, these
// storage primitives and the clock that judges expiry.
//
// Which clock decides: the store's own. Every expiry is judged by one clock
// that every instance of a service shares: the store's (the database
// server's or Redis's), never the application's. "Expired" means
// expires_at <= the store's clock now. A completed record expires the TTL
// after the store's clock at completion. Purge deletes what the store's
// clock says has expired. A lease (Redis PX/PEXPIRE) is judged by the store
// too, so instances whose clocks disagree by hours still agree on every
// record and every lease. A store may offer a clock for tests in its
// configuration: a func() time.Time it reads instead of its own, sent with
// each statement. It is never for production, where every instance would
// need the very same one. A test clock drives what the store judges by its
// clock: record expiries, CreatedAt, Purge and the leases of a [backend.Stepper]'s
// phases. It does not drive the hold of a reservation (a lease taken by
// Reserve, as on Redis), which runs on the store's own time.
//
// A store with no clock it can read (etcd; the DynamoDB and Spanner
// clients) keeps the same guarantee by other means. It judges a hold by a
// duration the store itself counts down (an etcd lease, a TTL counted by
// the server) or by a duration measured on one host's monotonic clock from
// a revision that host read, never by comparing an instant one host wrote
// (the holder's clock plus the lease) with another host's clock: hosts
// whose clocks differ by more than a lease would take over a live hold, or
// never take over a dead one. It judges a completed record's expiry the
// same way; where it can only compare a written instant with the reader's
// clock, it adds to the expiry it writes the largest disagreement between
// hosts' clocks it tolerates, so that no host sees a record expire before
// its TTL, and documents that bound. Such a store cannot take a test
// clock; conformance checks its expiries on real time.
//
// Precision and rounding: a store keeps times to the millisecond (see the
// rules below). A store whose expiry mechanism is coarser (an etcd lease
// lasts whole seconds) rounds every TTL and lease up to a whole number of
// its units, never down: a record is never absent before its TTL has
// passed, and lasts at most one unit longer. A store whose leases cannot
// be shorter than some bound (an etcd lease lasts at least about 1.5 times
// the cluster's election timeout) lengthens a shorter lease to that bound,
// and a waiter's one-second bound below becomes one second plus one unit.
//
// Rules every implementation follows:
//
//   - No method asks its pool for a second connection while it holds one.
//     One call of Reserve uses at most one connection, and the [backend.Txn] it
//     returns keeps using that same connection until Complete or Rollback
//     returns; after that the connection is back in the pool.
//   - Errors that a retry of the whole attempt can cure (serialization
//     failures, deadlocks, lock wait timeouts, a busy database) are wrapped
//     with [backend.ErrConflict]; a key held past the wait bound is reported with
//     [ErrInProgress]; everything else is returned as it is (wrapped with %w)
//     and makes [Guard.Do] fail closed, with [ErrStore] added to the chain.
//   - With r.Wait == 0, Reserve reports [ErrInProgress] only for a key that
//     another caller holds, or may hold: a store busy with callers of other
//     keys (one writer at a time) waits for them within its own lock
//     timeout (and, where it can bound that wait, no later than
//     r.Deadline), or reports [backend.ErrConflict]. A lock that may be the key's
//     but cannot be told apart without waiting (SQLite's write lock held
//     by another process) is waited for until r.Deadline, then reported
//     as [ErrInProgress].
//   - Methods return promptly, with ctx.Err() in the chain, once ctx is done.
//   - Keys are compared byte-exact, in the ID and in the Scope: no case
//     folding, no trimming of spaces, no Unicode normalisation.
//   - Status, header and body are stored and returned byte-exact, whatever
//     the bytes: header names and values need not be UTF-8, and each name
//     keeps its values in order. A zero-length Body may come back nil or
//     empty, and an empty Header nil or empty: they are the same response,
//     and a store need not keep them apart.
//   - A returned *Record belongs to the caller, who may keep and change it:
//     the store keeps no reference to it, to its Header or to its Body, and
//     each caller gets a copy of its own.
//   - Times are kept to at least millisecond precision, rounding down, for
//     every clock reading the core accepts, from [backend.MinClock]() to
//     [backend.MaxExpiry]: a record never outlives its expiry, and a record that
//     expires at MaxExpiry() never expires. A store given a test clock
//     refuses a reading outside that range with [ErrInvalidConfig] before
//     it writes anything ([backend.CheckClock]), and clamps every expiry to
//     MaxExpiry ([backend.Expiry]).
//   - A store that holds keys by lease (a reservation that can run out while
//     fn runs, as on Redis) refuses Complete from an owner whose lease ran
//     out and was taken over: it returns [backend.ErrLeaseLost] and applies nothing
//     of that owner's transaction.
//   - On such a store the lease ends a hold, not the provisional expiry
//     ([backend.Reservation].ExpiresAt, which only bounds how long a record left
//     pending may last): once the lease ran out the key is free to take
//     over, and a caller already waiting for it takes it within one second
//     of the lease's end, not at the end of its wait.
//   - Taking over a lapsed lease is a compare-and-swap on the reservation
//     that lapsed, as taking a free key is one on its absence: of several
//     callers that find a key free or its lease lapsed at once, in one
//     process or in several, exactly one obtains a Txn. A read followed by
//     an unconditional write is not enough.
//   - A stale owner (one whose lease was taken over) changes nothing: its
//     Rollback frees nothing and never the new owner's key, and its
//     Complete returns an error wrapping [backend.ErrLeaseLost]. An owner
//     whose lease ran out but was not taken over is not stale: its
//     Complete may still commit (nobody else ran fn), or fail as a lost
//     lease; either keeps the guarantee.
//   - A hold ends when its holder dies, with nothing else to end it: a
//     reservation on a lease store carries a lease that the store counts
//     down (on a transactional store, the hold dies with the holder's
//     connection). A hold written with no end, that a waiter takes over
//     only after watching it for a whole lease itself, keeps out for good
//     the callers whose wait is shorter than the lease.
//   - For a client that multiplexes every call over one connection (gRPC,
//     HTTP/2, as etcd, DynamoDB or Spanner clients do), a connection in
//     these rules means one call in flight: a Reserve and the Txn it
//     returns have at most one request outstanding at a time, and a
//     Reserve waiting for a held key holds no resource that the holder's
//     Complete or Rollback, or callers of other keys, need to go through.
//     A cap on a pool's connections (conformance.Options.MaxConns) is then
//     a cap on the calls in flight.
//   - A store whose requests or transactions are limited (etcd: 1.5 MiB a
//     request and 128 operations a transaction by default; DynamoDB: 100
//     items and 4 MB a transaction) documents its limits, and holds at
//     least a 1 MiB body with its key. When fn's writes through Tx and the
//     answer exceed them, Complete commits nothing, returns an error that
//     does not wrap [backend.ErrConflict] (a retry cannot cure it) and frees the
//     key, as a failed Complete does: it never stores the answer without
//     the writes, nor splits them over several transactions.
//
// Writing a backend, step by step:
//
//  1. Choose the native transaction handle Tx that fn receives: every
//     write fn does through it must commit or roll back with the key.
//  2. Implement Reserve and Purge, and the Txn they return (Tx, Complete,
//     Rollback), following the rules above and the methods' documentation.
//  3. Map the driver's errors in one function: [backend.ErrConflict] for what a
//     retry cures, [ErrInProgress] for a key held past the wait bound,
//     [ErrSchema] for a missing table or column of the store's own,
//     everything else wrapped as it is. Implement [backend.ConflictClassifier] if
//     fn's own statements can meet conflicts. Name a key in error text by
//     the Key itself (fmt's %v prints "#" and [Key.Hash]), never by its
//     Scope or ID: errors reach logs.
//  4. If the store keeps its records in a schema of its own, implement
//     [backend.Migrator] and [backend.SchemaChecker]. If it holds resources of its own
//     (prepared statements), implement [io.Closer]: Close releases them,
//     never the caller's pool, and a reservation already made still
//     completes or rolls back.
//  5. Run conformance.Run in the store's tests, with honest
//     conformance.Features and, if it can, a Fixture.Reopen that opens
//     another instance on the same records; each case quotes the sentence
//     it checks. The suite checks every interface the store implements:
//     KeyStore and Txn always, [backend.Stepper], [backend.KeyAdmin], [backend.KeyLister],
//     [backend.QuotaCounter] and [backend.Migrator] when the store has them (their cases
//     are skipped, named, when it does not). Features declares what the
//     store cannot do, and the suite then checks the rule documented for
//     it instead: no test clock (NoClock: expiries on real time), a coarse
//     expiry (ExpiryGranularity), leases no shorter than a bound
//     (MinLease), a tolerated disagreement of hosts' clocks (ClockSkew).
//     A store that reads the application host's clock anywhere sets
//     Fixture.ReopenAt, so that the suite runs its instances on clocks an
//     hour apart. docs/backends.md lists the cases, the leases and TTLs
//     they use and the clocks they drive.
//
// Conformance of an implementation is checked by the conformance package.
type KeyStore[Tx any] interface {
	// Reserve tries to take the key for the caller, in a new transaction.
	// It has exactly three successful outcomes:
	//
	//   - (txn, nil, nil): no live record existed (none at all, or only one
	//     whose ExpiresAt <= the store's clock now); a record for r.Key with r.Fingerprint is
	//     now held by txn's open transaction, which the caller ends with
	//     Complete or Rollback. Other callers of the same key cannot take it
	//     until then. On the SQL stores the reservation is a row inserted under
	//     the table's unique key in the transaction the effect will use, so a
	//     rollback frees the key with the effect.
	//   - (nil, rec, nil): a completed, unexpired record exists; rec holds it
	//     (whatever its fingerprint: the core compares). No transaction is
	//     left open and no connection is held.
	//   - (nil, nil, err) with err wrapping [ErrInProgress]: another caller
	//     holds the key and still held it when r.Wait ran out (r.Wait == 0:
	//     do not wait at all).
	//
	// While another caller holds the key, Reserve blocks (up to r.Wait and
	// while ctx lives) until that caller ends its hold. If that caller
	// completes, Reserve returns the record; if it rolls back or loses its
	// lease, Reserve competes again for the key. Under concurrent calls with the same key at most one obtains a
	// Txn at any time.
	//
	// A backend may send the reservation in the same round trip as its
	// BEGIN. It may first look the key up outside a transaction, so that a
	// replay costs one round trip.
	//
	// A record completed while Reserve waited for its holder is judged by
	// the expiry it was completed with, never by the provisional one of the
	// reservation. It is returned, never taken over.
	Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[Tx], *backend.Record, error)

	// Purge deletes at most limit records whose ExpiresAt <= the store's
	// clock now, in one short transaction of its own (one connection), and
	// reports how many it deleted. Records held by an open transaction are
	// never deleted. Purge never waits for them either, except on a store
	// with one writer at a time for the whole database (SQLite). There
	// Purge queues for the write lock like every writer, while ctx lives. A
	// backend whose records expire by themselves may return 0.
	//
	// A record re-reserved or completed after Purge chose it is not
	// deleted. The delete re-checks each record it chose (its expiry, or
	// the revision the scan saw) in the same atomic step. Checking only
	// that the record is not held is not enough: a key taken and completed
	// again between the scan and the delete is not held either, and
	// deleting it loses its answer, so that a retry runs fn again. Several
	// Purges may run at once, on several instances. The count is of
	// records deleted, not of records chosen, and never more than limit,
	// however many expired records there are. A store that caps the
	// operations of one transaction (etcd, DynamoDB) deletes in as many
	// transactions as it needs, each deleting only what it re-checked. It
	// reports their sum and stops at limit.
	Purge(ctx context.Context, limit int) (int, error)
}
