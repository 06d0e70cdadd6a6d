package backend

import (
	"context"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency/internal/ascii"
)

// Stepper is an optional interface of a idempotency.KeyStore: the primitives of
// multi-step operations (Operation). The SQL stores implement it; a store
// that cannot share a transaction with the caller's effects (Redis) does
// not, and Operation.Run refuses it with [errors.ErrUnsupported].
//
// An operation's key lives in the same row (record) as a key of
// Guard.Do, with three more things: its progress (bytes the core encodes:
// the next step, the step data, the caller's input), its owner (a token of
// the run that drives it) with the end of that owner's lease, and how many
// runs failed on it (tries). A key with progress is unfinished: the
// operation stopped between two steps, committed at a recovery point.
//
// Rules, besides those of idempotency.KeyStore:
//
//   - An unfinished key is never expired and never purged: its expiry is
//     [MaxExpiry] until it completes, and idempotency.KeyStore.Purge skips it.
//   - idempotency.KeyStore.Reserve treats an unfinished key as held: it reports
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
	//     a new key, held as idempotency.KeyStore.Reserve holds it, so Rollback frees
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
	if i := ascii.IndexNotPrintable(a.Owner); i >= 0 {
		return fmt.Errorf("%w: owner token byte %d is %#02x, not printable ASCII", ErrInvalidConfig, i, a.Owner[i])
	}
	return nil
}

// MaxOwnerLen is the longest [Acquisition].Owner, in bytes.
const MaxOwnerLen = 64

// MaxAbandoned is the largest [AbandonedQuery].Limit.
const MaxAbandoned = 1000

// AbandonedQuery selects the keys [Stepper.Abandoned] lists.
type AbandonedQuery struct {
	// Grace is how long ago, at least, the lease must have ended.
	Grace time.Duration
	// MaxTries: only keys with fewer tries are listed (so 0 lists none;
	// the Completer asks with its MaxTries, at least 1).
	MaxTries int
	// Limit bounds the list: 1 to 1000.
	Limit int
}

// Validate returns an error wrapping [ErrInvalidConfig] unless q's Limit is
// 1 to 1000 and its Grace and MaxTries are not negative.
func (q AbandonedQuery) Validate() error {
	switch {
	case q.Limit < 1 || q.Limit > MaxAbandoned:
		return fmt.Errorf("%w: limit %d outside 1..%d", ErrInvalidConfig, q.Limit, MaxAbandoned)
	case q.Grace < 0:
		return fmt.Errorf("%w: negative grace %v", ErrInvalidConfig, q.Grace)
	case q.MaxTries < 0:
		return fmt.Errorf("%w: negative MaxTries %d", ErrInvalidConfig, q.MaxTries)
	}
	return nil
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

// CheckProgress is the check a store runs on the progress given to
// [Phase].Save and Release: it returns an error wrapping
// [ErrInvalidConfig] for a progress a Phase cannot store: nil, or longer than [MaxProgressLen].
func CheckProgress(progress []byte) error {
	switch {
	case progress == nil:
		return fmt.Errorf("%w: nil progress", ErrInvalidConfig)
	case len(progress) > MaxProgressLen:
		return fmt.Errorf("%w: progress of %d bytes, more than %d", ErrInvalidConfig, len(progress), MaxProgressLen)
	}
	return nil
}
