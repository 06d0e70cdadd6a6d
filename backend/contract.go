package backend

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Txn is a reservation held in an open transaction, returned by
// idempotency.KeyStore.Reserve. Exactly one of Complete or Rollback is called, once,
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

// Reservation is what idempotency.KeyStore.Reserve is asked to reserve. The core fills
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
	// Config.WaitTimeout); Wait is then zero. Every store honours it as it
	// honours Wait == 0: a key held gives [ErrInProgress] at once. A store
	// that would wait for a lock on a first try (see Deadline) waits for
	// none either. While a caller of another key that it knows of (in the
	// same store value) holds the lock, it reports an error wrapping
	// ErrStore at once. The store is busy, the key is not held, and
	// retrying later is safe. While a writer it cannot see into holds the
	// lock (SQLite: another process or connection), that writer may hold
	// the key. The store then reports [ErrInProgress] at once, unless the
	// key is found completed.
	//
	// Deadline stays the bound of the call's conflict retries, so NoWait is
	// a field of its own rather than a Deadline already passed.
	NoWait bool
	// Deadline is when the whole call's wait bound (Config.WaitTimeout,
	// counted from the start of Guard.Do) runs out; zero means no bound
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

// Response builds the replayed [Response] held by rec, with its
// ExpiresAt (TTL is left zero: the record does not keep it).
func (rec *Record) Response() Response {
	return Response{Status: rec.Status, Header: rec.Header, Body: rec.Body, Replayed: true, ExpiresAt: rec.ExpiresAt}
}

// Expiry computes the expiry a store writes for a record completed at now
// (by its own clock) with [Reservation].TTL: now plus ttl, clamped to
// [MaxExpiry].
// A negative ttl counts as zero.
func Expiry(now time.Time, ttl time.Duration) time.Time {
	return now.Add(max(0, min(ttl, MaxExpiry().Sub(now))))
}

// CheckClock is the check a store that reads a test clock runs on each
// reading: it returns an error wrapping [ErrInvalidConfig] unless now is a
// clock reading the contract covers, from [MinClock]() to just before
// [MaxExpiry](). A store that reads a test clock calls it on every reading
// before it writes anything.
func CheckClock(now time.Time) error {
	if now.Before(MinClock()) || !now.Before(MaxExpiry()) {
		return fmt.Errorf("%w: clock reading %v outside %v..%v", ErrInvalidConfig, now, MinClock(), MaxExpiry())
	}
	return nil
}

// ConflictClassifier is an optional interface of a idempotency.KeyStore. IsConflict
// reports whether an error fn returned is a retryable conflict of the
// store: a deadlock or serialization failure met by one of fn's own
// statements on Tx. For such an error, Guard.Do rolls back and retries
// the whole attempt, fn included, as it does for [ErrConflict]. The
// rolled-back attempt left no effect through Tx, and callers do not see
// conflicts unless the retries are exhausted.
type ConflictClassifier interface {
	IsConflict(err error) bool
}

// Migrator is an optional interface of a idempotency.KeyStore that keeps its records
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

// SchemaChecker is an optional interface of a idempotency.KeyStore that keeps its
// records in a schema of its own ([Migrator]). CheckSchema reads the
// database's catalog, writes nothing, and returns nil when the store's
// keys table exists with every column this version's statements use (and,
// with c.Quota, its quota table with its columns). Otherwise it returns an
// error wrapping [ErrSchema] that names the missing table (or its missing
// columns) and says to run Migrate or apply Schema. Any other failure (a
// cut connection) is returned as it is. Guard.CheckSchema calls it; a
// store without it passes that check.
type SchemaChecker interface {
	CheckSchema(ctx context.Context, c SchemaCheck) error
}

// MissingColumns returns the columns of want that have lacks, in want's
// order, comparing names without regard to case: the check a
// [SchemaChecker] makes of a table whose columns it read from the
// database's catalog.
func MissingColumns(have, want []string) []string {
	var missing []string
	for _, col := range want {
		if !slices.ContainsFunc(have, func(h string) bool { return strings.EqualFold(h, col) }) {
			missing = append(missing, col)
		}
	}
	return missing
}

// SchemaCheck says what Guard.CheckSchema (and
// [SchemaChecker.CheckSchema]) verifies besides the keys table.
type SchemaCheck struct {
	// Quota: the service uses quotas (Guard.AdmitQuota, idemhttp's
	// Config.Quota), so the store's quota table must exist too. A service
	// without quotas may have applied Schema without the quota table's
	// DDL; it leaves Quota false.
	Quota bool
}
