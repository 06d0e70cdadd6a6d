package idempotency

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// KeyStore is the storage a [Guard] runs on. Tx is the backend's native
// transaction handle (pgx.Tx, *sql.Tx, a Redis pipeline): the caller's effect
// runs on the very transaction that holds the key.
//
// The core owns the protocol: validation, fingerprint comparison, retries of
// [ErrConflict], the observer. A backend owns its transaction type, these
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
// clock: record expiries, CreatedAt, Purge and the leases of a [Stepper]'s
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
//     One call of Reserve uses at most one connection, and the [Txn] it
//     returns keeps using that same connection until Complete or Rollback
//     returns; after that the connection is back in the pool.
//   - Errors that a retry of the whole attempt can cure (serialization
//     failures, deadlocks, lock wait timeouts, a busy database) are wrapped
//     with [ErrConflict]; a key held past the wait bound is reported with
//     [ErrInProgress]; everything else is returned as it is (wrapped with %w)
//     and makes [Guard.Do] fail closed, with [ErrStore] added to the chain.
//   - With r.Wait == 0, Reserve reports [ErrInProgress] only for a key that
//     another caller holds, or may hold: a store busy with callers of other
//     keys (one writer at a time) waits for them within its own lock
//     timeout (and, where it can bound that wait, no later than
//     r.Deadline), or reports [ErrConflict]. A lock that may be the key's
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
//     every clock reading the core accepts, from [MinClock]() to
//     [MaxExpiry]: a record never outlives its expiry, and a record that
//     expires at MaxExpiry() never expires. A store given a test clock
//     refuses a reading outside that range with [ErrInvalidConfig] before
//     it writes anything ([CheckClock]), and clamps every expiry to
//     MaxExpiry ([Expiry]).
//   - A store that holds keys by lease (a reservation that can run out while
//     fn runs, as on Redis) refuses Complete from an owner whose lease ran
//     out and was taken over: it returns [ErrLeaseLost] and applies nothing
//     of that owner's transaction.
//   - On such a store the lease ends a hold, not the provisional expiry
//     ([Reservation].ExpiresAt, which only bounds how long a record left
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
//     Complete returns an error wrapping [ErrLeaseLost].
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
//     does not wrap [ErrConflict] (a retry cannot cure it) and frees the
//     key, as a failed Complete does: it never stores the answer without
//     the writes, nor splits them over several transactions.
//
// Writing a backend, step by step:
//
//  1. Choose the native transaction handle Tx that fn receives: every
//     write fn does through it must commit or roll back with the key.
//  2. Implement Reserve and Purge, and the Txn they return (Tx, Complete,
//     Rollback), following the rules above and the methods' documentation.
//  3. Map the driver's errors in one function: [ErrConflict] for what a
//     retry cures, [ErrInProgress] for a key held past the wait bound,
//     [ErrSchema] for a missing table or column of the store's own,
//     everything else wrapped as it is. Implement [ConflictClassifier] if
//     fn's own statements can meet conflicts. Name a key in error text by
//     the Key itself (fmt's %v prints "#" and [Key.Hash]), never by its
//     Scope or ID: errors reach logs.
//  4. If the store keeps its records in a schema of its own, implement
//     [Migrator] and [SchemaChecker]. If it holds resources of its own
//     (prepared statements), implement [io.Closer]: Close releases them,
//     never the caller's pool, and a reservation already made still
//     completes or rolls back.
//  5. Run conformance.Run in the store's tests, with honest
//     conformance.Features and, if it can, a Fixture.Reopen that opens
//     another instance on the same records; each case quotes the sentence
//     it checks. The suite checks every interface the store implements:
//     KeyStore and Txn always, [Stepper], [KeyAdmin], [KeyLister],
//     [QuotaCounter] and [Migrator] when the store has them (their cases
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
	Reserve(ctx context.Context, r Reservation) (Txn[Tx], *Record, error)

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

// Txn is a reservation held in an open transaction, returned by
// [KeyStore.Reserve]. Exactly one of Complete or Rollback is called, once,
// by the goroutine that called Reserve.
type Txn[Tx any] interface {
	// Tx is the native transaction handle; the caller's effect runs on it.
	//
	// fn must not commit or roll back Tx itself. A store whose handle lets
	// fn do so anyway (a *sql.Tx) keeps the guarantee: never an answer
	// without its effect, nor a second run. After fn's rollback, Complete
	// fails and the key is free. After fn's commit, the key holds fn's
	// answer or stays held (Reserve reports [ErrInProgress]) until the
	// reservation's provisional expiry: the store's clock at the
	// reservation plus [Reservation].TTL. A store may instead refuse fn's
	// Commit and Rollback, as package postgres refuses Commit.
	Tx() Tx

	// Complete stores resp (status, header, body byte-exact) as the key's
	// record, marks it completed and commits the transaction with it. The
	// effect, the key and the response become visible together or not at
	// all. It may send the update in the same round trip as COMMIT.
	//
	// Complete is atomic whatever interrupts it (ctx ending, a cut
	// connection, a crash): the effect and the record are committed
	// together or not at all. A retry with the same key then replays the
	// record or runs fn once. Called with a ctx that is already done,
	// it either commits nothing and returns an error with ctx.Err() in its
	// chain, or commits everything and returns nil.
	//
	// The completed record's expiry, stored in place of the reservation's,
	// is the store's clock at completion plus [Reservation].TTL, clamped to
	// [MaxExpiry] (see [Expiry]). So a slow call is remembered for the whole
	// TTL after it answered. A store keeps it to at least millisecond
	// precision, rounding down. After it returns, whatever the error, the
	// transaction is over for the caller and the connection released. The
	// server may still finish a COMMIT whose reply was lost: a retry of the
	// key waits for it, then replays. A commit that fails with a retryable
	// conflict wraps [ErrConflict]. A backend that can tell that it lost the
	// key (an expired lease taken over) returns [ErrLeaseLost].
	//
	// A Complete that returns an error and committed nothing frees the key
	// as Rollback does: another caller can take it within one second, never
	// only when a lease runs out. Only a Complete that cannot tell whether
	// its commit landed (a lost reply) may leave the key held until the
	// server settles it or the lease ends.
	Complete(ctx context.Context, resp Response) error

	// Rollback abandons the transaction: the reservation and every effect
	// done through Tx are discarded and the key is free again. It releases
	// the connection even when it returns an error. It must work with an
	// already cancelled ctx (the caller may be unwinding after a cancel).
	Rollback(ctx context.Context) error
}

// Reservation is what [KeyStore.Reserve] is asked to reserve. The core fills
// it; every field is already validated.
type Reservation struct {
	Key         Key
	Fingerprint string
	// TTL is how long the completed record is remembered, counted by the
	// store's clock from its completion ([Txn.Complete]); records whose
	// ExpiresAt <= the store's clock now count as absent. A store may keep
	// the store's clock now plus TTL (clamped with [Expiry]) as the pending
	// reservation's provisional expiry. At least 1ms.
	TTL time.Duration
	// Wait bounds how long Reserve may wait for a key another caller holds;
	// zero means do not wait.
	Wait time.Duration
	// NoWait is set when the caller does not wait at all (a negative
	// [Config.WaitTimeout]); Wait is then zero. Every store honours it as it
	// honours Wait == 0: a key held gives [ErrInProgress] at once. A store
	// that would wait for a lock on a first try (see Deadline) waits for
	// none either. While a caller of another key that it knows of (in the
	// same store value) holds the lock, it reports an error wrapping
	// [ErrStore] at once. The store is busy, the key is not held, and
	// retrying later is safe. While a writer it cannot see into holds the
	// lock (SQLite: another process or connection), that writer may hold
	// the key. The store then reports [ErrInProgress] at once, unless the
	// key is found completed.
	//
	// Deadline stays the bound of the call's conflict retries, so NoWait is
	// a field of its own rather than a Deadline already passed.
	NoWait bool
	// Deadline is when the whole call's wait bound ([Config.WaitTimeout],
	// counted from the start of [Guard.Do]) runs out; zero means no bound
	// was given. A store that waits for a lock on a first try (Wait == 0),
	// such as SQLite's one write lock held by other writers, waits no later
	// than Deadline. There it reports [ErrInProgress] if the lock may be
	// the key's (a writer it cannot see into holds it).
	Deadline time.Time
}

// Record is a completed key as a store returns it.
type Record struct {
	Key         Key
	Fingerprint string
	Status      int
	Header      http.Header
	Body        []byte
	// CreatedAt is set by the store's clock when the key was reserved, to
	// at least millisecond precision (rounding down), and is never after
	// ExpiresAt. It is for people reading the store (logs, an admin page);
	// the core reads it only for [Event].RecordAge.
	CreatedAt time.Time
	// ExpiresAt is the store's clock at completion plus the TTL, clamped
	// to [MaxExpiry]: the record is absent once the store's clock reaches
	// it.
	ExpiresAt time.Time
}

// Expiry is now plus ttl, clamped to [MaxExpiry]: the expiry a store
// gives a record completed at now (its own clock) with [Reservation].TTL.
// A negative ttl counts as zero.
func Expiry(now time.Time, ttl time.Duration) time.Time {
	return now.Add(max(0, min(ttl, MaxExpiry().Sub(now))))
}

// CheckClock returns an error wrapping [ErrInvalidConfig] unless now is a
// clock reading the contract covers, from [MinClock]() to just before
// [MaxExpiry](). A store that reads a test clock calls it on every reading
// before it writes anything.
func CheckClock(now time.Time) error {
	if now.Before(MinClock()) || !now.Before(MaxExpiry()) {
		return fmt.Errorf("%w: clock reading %v outside %v..%v", ErrInvalidConfig, now, MinClock(), MaxExpiry())
	}
	return nil
}

// Response builds the replayed [Response] held by rec, with its
// ExpiresAt (TTL is left zero: the record does not keep it).
func (rec *Record) Response() Response {
	return Response{Status: rec.Status, Header: rec.Header, Body: rec.Body, Replayed: true, ExpiresAt: rec.ExpiresAt}
}

// ConflictClassifier is an optional interface of a [KeyStore]. IsConflict
// reports whether an error fn returned is a retryable conflict of the
// store: a deadlock or serialization failure met by one of fn's own
// statements on Tx. For such an error, [Guard.Do] rolls back and retries
// the whole attempt, fn included, as it does for [ErrConflict]. The
// rolled-back attempt left no effect through Tx, and callers do not see
// conflicts unless the retries are exhausted.
type ConflictClassifier interface {
	IsConflict(err error) bool
}

// Migrator is an optional interface of a [KeyStore] that keeps its records
// in a schema of its own, as the SQL stores do.
type Migrator interface {
	// Schema returns the DDL that Migrate runs, for the caller's own
	// migration tool.
	Schema() string
	// Migrate creates the store's table and indexes if they are missing.
	// It is idempotent: running it again, or from several callers at once,
	// changes nothing and returns nil.
	Migrate(ctx context.Context) error
}

// SchemaChecker is an optional interface of a [KeyStore] that keeps its
// records in a schema of its own ([Migrator]). CheckSchema reads the
// database's catalog, writes nothing, and returns nil when the store's
// keys table exists with every column this version's statements use (and,
// with c.Quota, its quota table with its columns). Otherwise it returns an
// error wrapping [ErrSchema] that names the missing table (or its missing
// columns) and says to run Migrate or apply Schema. Any other failure (a
// cut connection) is returned as it is. [Guard.CheckSchema] calls it; a
// store without it passes that check.
type SchemaChecker interface {
	CheckSchema(ctx context.Context, c SchemaCheck) error
}

// Stepper is an optional interface of a [KeyStore]: the primitives of
// multi-step operations ([Operation]). The SQL stores implement it; a store
// that cannot share a transaction with the caller's effects (Redis) does
// not, and [Operation.Run] refuses it with [errors.ErrUnsupported].
//
// An operation's key lives in the same row (record) as a key of
// [Guard.Do], with three more things: its progress (bytes the core encodes:
// the next step, the step data, the caller's input), its owner (a token of
// the run that drives it) with the end of that owner's lease, and how many
// runs failed on it (tries). A key with progress is unfinished: the
// operation stopped between two steps, committed at a recovery point.
//
// Rules, besides those of [KeyStore]:
//
//   - An unfinished key is never expired and never purged: its expiry is
//     [MaxExpiry] until it completes, and [KeyStore.Purge] skips it.
//   - [KeyStore.Reserve] treats an unfinished key as held: it reports
//     [ErrInProgress], at once or after waiting, and never takes it over.
//   - Every phase is one transaction of the store on the key's row: the
//     caller's writes through [Phase.Tx], the progress and the lease commit
//     together or not at all.
//   - Taking a lease is a compare-and-swap on the row, as taking a free
//     key is: of several callers that find an unfinished key's lease free
//     or ended at once, in one process or in several, exactly one obtains a
//     Phase; the others get [ErrInProgress].
//   - Leases are judged by the store's clock, as expiries are.
//   - A phase commits only while it holds its key. A store that holds a
//     phase by its lease alone (no transaction, as on etcd) lets another
//     owner take the key once the lease ended by the store's clock, even
//     while the phase is open. The stale phase's Save, Release and Complete
//     then return an error wrapping [ErrLeaseLost] and commit nothing, and
//     its Rollback frees nothing. A store that holds a phase in a
//     transaction keeps the key until the phase ends, whatever its lease.
//   - An Acquisition, a progress or a limit out of the bounds given
//     below is refused with an error wrapping [ErrInvalidConfig] before
//     anything is written.
type Stepper[Tx any] interface {
	// Acquire opens a transaction on a.Key for one phase of the run a.Owner.
	// It has exactly three successful outcomes:
	//
	//   - (phase, nil, nil): the key is the caller's in phase's open
	//     transaction, which the caller ends with Save, Release, Complete or
	//     Rollback. Either no live record existed (phase.Progress() is nil:
	//     a new key, held as [KeyStore.Reserve] holds it, so Rollback frees
	//     it), or the key is unfinished and its lease was free, ended (by
	//     the store's clock), or already a.Owner's. Then phase.Progress()
	//     is the progress last saved, phase.Fingerprint() the fingerprint
	//     the operation started with, and the lease is a.Owner's in the
	//     transaction. Taking over another owner's ended lease counts in
	//     Tries only if a later Release commits.
	//   - (nil, rec, nil): the key is completed and live, as in Reserve.
	//   - (nil, nil, err) with err wrapping [ErrInProgress]: the key is
	//     held by a transaction of Reserve or Acquire (waited for up to
	//     a.Wait, as Reserve does) or leased to another owner until a later
	//     time (reported at once: the core polls).
	//
	// a.Owner is a token of at most 64 printable ASCII bytes; a.Lease is at
	// least one millisecond.
	Acquire(ctx context.Context, a Acquisition) (Phase[Tx], *Record, error)

	// Abandoned lists up to q.Limit unfinished keys whose lease ended at
	// least q.Grace ago by the store's clock (a run that released its lease
	// ended it then) and whose Tries are under q.MaxTries, the longest
	// ended first. It takes no lease and locks nothing: the caller then
	// acquires each one, and may lose it to another.
	Abandoned(ctx context.Context, q AbandonedQuery) ([]AbandonedKey, error)
}

// Phase is one transaction on an operation's key, returned by
// [Stepper.Acquire]. Exactly one of Save, Release, Complete or Rollback is
// called, once, by the goroutine that called Acquire. After it returns,
// whatever the error, the transaction is over and its connection released.
type Phase[Tx any] interface {
	// Tx is the native transaction handle; the phase's writes run on it.
	Tx() Tx
	// Fingerprint is the fingerprint the operation started with, or the
	// Acquisition's for a new key.
	Fingerprint() string
	// Progress is the progress last saved, nil for a new key.
	Progress() []byte
	// Tries is how many runs released the key after a failure.
	Tries() int
	// Save commits the phase: the writes done through Tx, progress as the
	// key's progress (at most [MaxProgressLen] bytes, never nil), and the
	// lease, the Acquisition's owner's until the store's clock plus its
	// Lease. The key is unfinished.
	Save(ctx context.Context, progress []byte) error
	// Release commits the phase with progress and the lease ended now, and
	// counts one more try: a run that failed and lets a retry or the
	// completer resume the key. Writes done through Tx are committed too:
	// the core rolls a failed phase back before it releases, in a new
	// Acquire.
	Release(ctx context.Context, progress []byte) error
	// Complete stores resp as the key's completed record and commits, as
	// [Txn.Complete] does, with the writes done through Tx. The progress,
	// owner, lease and tries are cleared; the expiry is the store's clock
	// plus the Acquisition's TTL.
	Complete(ctx context.Context, resp Response) error
	// Rollback discards the phase: the writes done through Tx and the
	// lease taken by Acquire. An unfinished key stays as it was committed
	// (progress, owner, lease end); a new key is free again. It must work
	// with an already cancelled ctx.
	Rollback(ctx context.Context) error
}

// Acquisition is what [Stepper.Acquire] is asked for: a [Reservation] (TTL
// is the completed record's) plus the run's owner token and lease.
type Acquisition struct {
	Reservation
	// Owner names the run that drives the operation: a random token.
	Owner string
	// Lease is how long the key stays the owner's after Acquire's or a
	// Save's commit, by the store's clock.
	Lease time.Duration
}

// maxAbandoned is the largest [AbandonedQuery].Limit.
const maxAbandoned = 1000

// AbandonedQuery selects the keys [Stepper.Abandoned] lists.
type AbandonedQuery struct {
	// Grace is how long ago, at least, the lease must have ended.
	Grace time.Duration
	// MaxTries: only keys with fewer tries are listed.
	MaxTries int
	// Limit bounds the list: 1 to 1000.
	Limit int
}

// AbandonedKey is an unfinished key as [Stepper.Abandoned] lists it.
type AbandonedKey struct {
	Key         Key
	Fingerprint string
	Progress    []byte
	Tries       int
	// LeaseEnded is when the last lease ended, by the store's clock.
	LeaseEnded time.Time
}

// MaxProgressLen is the largest progress a [Phase] stores, in bytes: the
// step data of an operation, its input and its position together.
const MaxProgressLen = 1 << 20

// KeyAdmin is an optional interface of a [KeyStore]: what an operator needs
// to look at one key and release it. Every store of this module implements
// it. [Guard.Inspect] and [Guard.Forget] validate the key first and call
// it.
type KeyAdmin interface {
	// Inspect returns what the store holds for key, with its body only if
	// body is true (BodyLen is always set). A key with no record gives an
	// error wrapping [ErrNotFound]. It takes no lock and waits for none.
	// A store that holds a new key in an open transaction with no row
	// visible to others (PostgreSQL) reports it [KeyHeld] if it can tell
	// without waiting, else [ErrNotFound]: its documentation says which.
	// For a key held by Reserve, ExpiresAt is the reservation's
	// provisional expiry if the store keeps one (its clock at the
	// reservation plus the TTL), zero otherwise, and LeaseEnds the end of
	// the holder's lease on a lease store, zero otherwise; a held key
	// with progress reports MaxExpiry and its lease's end, as an
	// unfinished one does.
	Inspect(ctx context.Context, key Key, body bool) (*KeyInfo, error)
	// Forget deletes key's record and returns what it deleted (without
	// the body). A key held (by a transaction of Reserve or Acquire, or by
	// a live lease) is refused with [ErrInProgress] and nothing changes;
	// Forget never waits for it. A key with no record gives [ErrNotFound].
	// An unfinished key whose lease ended is deleted: its operation will
	// not be resumed.
	Forget(ctx context.Context, key Key) (*KeyInfo, error)
}

// KeyLister is an optional interface of a [KeyStore] that can enumerate
// its keys: the SQL stores implement it, Redis does not.
type KeyLister interface {
	// List returns one page of the keys of q.Scope: the unfinished and
	// held ones first, then the others, each part in byte order of ID.
	// Bodies are not read.
	List(ctx context.Context, q ListQuery) (KeyPage, error)
	// Stats counts the store's records by state, by the store's clock.
	Stats(ctx context.Context) (Stats, error)
}

// KeyState says what a record is, as [KeyAdmin.Inspect] reports it.
type KeyState int

// The states of a record.
const (
	// KeyHeld: a call of [Guard.Do] holds the key in an open transaction,
	// or a run of an [Operation] holds its live lease.
	KeyHeld KeyState = iota + 1
	// KeyCompleted: the key's answer is stored and replayed.
	KeyCompleted
	// KeyUnfinished: an operation stopped between two steps and nobody
	// holds it: a retry with the key or the [Completer] resumes it.
	KeyUnfinished
	// KeyExpired: past its expiry by the store's clock, not yet purged; it
	// counts as absent.
	KeyExpired
)

// String returns "held", "completed", "unfinished" or "expired".
func (s KeyState) String() string {
	switch s {
	case KeyHeld:
		return "held"
	case KeyCompleted:
		return "completed"
	case KeyUnfinished:
		return "unfinished"
	case KeyExpired:
		return "expired"
	}
	return fmt.Sprintf("KeyState(%d)", int(s))
}

// KeyInfo is what a store holds for one key. The store fills the fields up
// to LeaseEnds; [Guard.Inspect] and [Guard.List] decode Progress into the
// fields after it.
type KeyInfo struct {
	Key         Key
	State       KeyState
	Fingerprint string
	// Status, Header and Body are the stored answer (completed or expired
	// keys); Body only when asked for.
	Status  int
	Header  http.Header
	Body    []byte
	BodyLen int
	// CreatedAt and ExpiresAt are by the store's clock; ExpiresAt is
	// [MaxExpiry] for an unfinished key, zero when the store cannot tell
	// (a key held in a transaction with no row yet).
	CreatedAt time.Time
	ExpiresAt time.Time
	// Progress, Tries and LeaseEnds describe an unfinished operation (a
	// key with progress): see [Stepper].
	Progress  []byte
	Tries     int
	LeaseEnds time.Time

	// Operation, Step and Failure are decoded from Progress: the
	// operation's name, the name of the step it resumes at, and the error
	// of its last failed run ("" if none).
	Operation string
	Step      string
	Failure   string
	// Sealed reports that the stored answer, or the operation's input and
	// step data, were sealed by a [Codec] ([Config.Codec]). [Guard.Inspect]
	// opens a sealed body with the Guard's Codec; a Guard without one
	// leaves Body nil.
	Sealed bool
}

// ListQuery selects one page of [KeyLister.List].
type ListQuery struct {
	// Scope is the exact scope whose keys are listed.
	Scope string
	// Limit is the page's size: 1 to 1000.
	Limit int
	// After is the Next of the page before; nil starts from the first key.
	After *ListCursor
}

// ListCursor is where a page of [KeyLister.List] ended: its last key.
type ListCursor struct {
	// Unfinished: the last key was in the first part (unfinished or held).
	Unfinished bool
	ID         string
}

// KeyPage is one page of [KeyLister.List].
type KeyPage struct {
	Keys []KeyInfo
	// Next resumes the listing; nil when this page is the last.
	Next *ListCursor
}

// Stats counts a store's records by state ([KeyLister.Stats]).
type Stats struct {
	// Held counts what Inspect reports [KeyHeld] from committed state:
	// the unfinished keys whose lease lives, and on a lease store the
	// reservations whose lease lives. A key held only by an open
	// transaction, with no committed row, need not be counted.
	Held                           int64
	Completed, Unfinished, Expired int64
	// OldestUnfinished is the creation of the oldest unfinished or held
	// operation, zero when there is none.
	OldestUnfinished time.Time
	// Failing counts the unfinished keys with at least one failed try.
	Failing int64
	// BodyBytes sums the bodies of live completed records.
	BodyBytes int64
}

// MaxOwnerLen is the longest [Acquisition].Owner, in bytes.
const MaxOwnerLen = 64

// Validate returns an error wrapping [ErrInvalidConfig] unless a is within
// the bounds of [Stepper.Acquire]: an Owner of 1 to [MaxOwnerLen] bytes of
// printable ASCII, a Lease and a TTL of at least a millisecond, a Wait not
// negative. Stores call it before anything is sent.
func (a Acquisition) Validate() error {
	switch {
	case a.Owner == "" || len(a.Owner) > MaxOwnerLen:
		return fmt.Errorf("%w: owner token of %d bytes, want 1 to %d", ErrInvalidConfig, len(a.Owner), MaxOwnerLen)
	case a.Lease < time.Millisecond:
		return fmt.Errorf("%w: lease %v shorter than 1ms", ErrInvalidConfig, a.Lease)
	case a.TTL < time.Millisecond:
		return fmt.Errorf("%w: TTL %v shorter than 1ms", ErrInvalidConfig, a.TTL)
	case a.Wait < 0:
		return fmt.Errorf("%w: negative wait %v", ErrInvalidConfig, a.Wait)
	}
	if i := indexNotPrintable(a.Owner); i >= 0 {
		return fmt.Errorf("%w: owner token byte %d is %#02x, not printable ASCII", ErrInvalidConfig, i, a.Owner[i])
	}
	return nil
}

// CheckProgress returns an error wrapping [ErrInvalidConfig] for a progress
// a [Phase] cannot store: nil, or longer than [MaxProgressLen].
func CheckProgress(progress []byte) error {
	switch {
	case progress == nil:
		return fmt.Errorf("%w: nil progress", ErrInvalidConfig)
	case len(progress) > MaxProgressLen:
		return fmt.Errorf("%w: progress of %d bytes, more than %d", ErrInvalidConfig, len(progress), MaxProgressLen)
	}
	return nil
}

// Validate returns an error wrapping [ErrInvalidConfig] unless q's Limit is
// 1 to 1000 and its Grace and MaxTries are not negative.
func (q AbandonedQuery) Validate() error {
	switch {
	case q.Limit < 1 || q.Limit > maxAbandoned:
		return fmt.Errorf("%w: limit %d outside 1..%d", ErrInvalidConfig, q.Limit, maxAbandoned)
	case q.Grace < 0:
		return fmt.Errorf("%w: negative grace %v", ErrInvalidConfig, q.Grace)
	case q.MaxTries < 0:
		return fmt.Errorf("%w: negative MaxTries %d", ErrInvalidConfig, q.MaxTries)
	}
	return nil
}

// Validate returns an error unless q's Limit is 1 to [MaxListLimit]
// ([ErrInvalidConfig]) and its Scope and cursor are a valid scope and id
// ([ErrInvalidKey]).
func (q ListQuery) Validate() error {
	if err := (Key{Scope: q.Scope, ID: "-"}).Validate(); err != nil {
		return err
	}
	if q.Limit < 1 || q.Limit > MaxListLimit {
		return fmt.Errorf("%w: list limit %d outside 1..%d", ErrInvalidConfig, q.Limit, MaxListLimit)
	}
	if q.After != nil {
		if err := (Key{Scope: q.Scope, ID: q.After.ID}).Validate(); err != nil {
			return fmt.Errorf("list cursor: %w", err)
		}
	}
	return nil
}

// QuotaCounter is an optional interface of a [KeyStore]: per-scope counters
// of a [Quota], kept in the store so that every instance of a service
// shares them. Every store of this module implements it. The counters of
// one scope live in one row (SQL) or hash (Redis) per window, named by the
// window's length and its start; a window starts at a multiple of its
// length since the Unix epoch, by the store's clock.
//
// Rules:
//
//   - AdmitQuota is one atomic statement (one round trip): of several
//     callers in one process or in several, no more than the limit are
//     counted in a window. It holds no connection when it returns, and
//     is never called while the caller holds one.
//   - What counts is atomicity, not the number of statements: a store
//     without conditional arithmetic in one statement (etcd, DynamoDB
//     without an update expression) reads the counters with their
//     revision and writes them with a compare-and-swap on it, retried
//     when another admission wrote first. A read followed by an
//     unconditional write is not enough: racing admissions overwrite each
//     other and count more than the limit. An admission that meets a
//     conflict it cannot settle (a serialization failure) counts nothing
//     and returns an error wrapping [ErrConflict]; the caller may retry.
//   - A key with a live completed record (by the store's clock) is not
//     counted and never refused: its replay costs nothing.
//   - Over a limit, nothing is counted.
//   - Nothing of the keys table is written.
type QuotaCounter interface {
	// AdmitQuota counts q.Key as a new key and as one more in flight in
	// the scope's current window, unless its record is completed and live
	// (Replay) or a limit of q.Quota is reached (Over): the keys counted
	// in the window reached MaxKeys, the keys in flight MaxInFlight, or
	// the bytes stored MaxBytes (checked in that order).
	AdmitQuota(ctx context.Context, q QuotaCheck) (QuotaAdmission, error)
	// EndQuota ends an admission that AdmitQuota counted: one less in
	// flight, one less key if none was created, and e.Bytes more stored,
	// all in the window the admission was counted in. A window already
	// purged is not recreated.
	EndQuota(ctx context.Context, e QuotaEnd) error
	// PurgeQuota deletes at most limit counters of windows that ended
	// (by the store's clock) and reports how many it deleted. A store
	// whose counters expire by themselves (Redis) returns 0.
	PurgeQuota(ctx context.Context, limit int) (int, error)
}

// QuotaCheck is what [QuotaCounter.AdmitQuota] is asked; the core fills it
// with a validated key and quota.
type QuotaCheck struct {
	Key   Key
	Quota Quota
}

// QuotaAdmission is the answer of [QuotaCounter.AdmitQuota].
type QuotaAdmission struct {
	// Counted: the key was counted; end it with [QuotaCounter.EndQuota].
	// False for a replay and for a refusal.
	Counted bool
	// Replay: the key's record is completed and live; nothing was counted.
	Replay bool
	// Over is the limit that refused the key, 0 when it was not refused.
	Over QuotaLimit
	// WindowStart is the start of the window the check counted in, by the
	// store's clock (zero for a replay).
	WindowStart time.Time
	// RetryAfter is the time left until the window ends, by the store's
	// clock (zero for a replay).
	RetryAfter time.Duration
}

// QuotaEnd ends an admission counted by [QuotaCounter.AdmitQuota].
type QuotaEnd struct {
	// Scope and Window name the counter: the key's scope, the quota's
	// window, and the admission's WindowStart.
	Scope       string
	Window      time.Duration
	WindowStart time.Time
	// Created: the request stored an answer with its key. Otherwise the key
	// is not counted any more (rolled back, replayed from another caller,
	// refused).
	Created bool
	// Bytes is the size of the stored answer's body, 0 if none.
	Bytes int64
}
