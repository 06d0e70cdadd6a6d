package backend

import "errors"

// The errors a store returns, wrapped with %w (see the package
// documentation for which method returns which). Package idempotency
// re-exports those its users check: the values are the same, so
// errors.Is matches either name.
var (
	// ErrInvalidKey: the key's id or scope is outside its allowed space. The
	// store was not touched. (HTTP 400.)
	ErrInvalidKey = errors.New("idempotency: invalid key")
	// ErrInvalidConfig: a Config field is out of range. Returned by New.
	ErrInvalidConfig = errors.New("idempotency: invalid config")
	// ErrInProgress: another caller holds the key and the wait bound
	// (Config.WaitTimeout) ran out before it finished, at once when it is
	// negative. fn was not called. (HTTP 409.)
	ErrInProgress = errors.New("idempotency: request with this key is in progress")
	// ErrConflict: a retryable store conflict (serialization failure,
	// deadlock, lock wait timeout, busy database). Stores wrap such errors
	// with it; Do retries them and returns one only when its retries are
	// exhausted.
	ErrConflict = errors.New("idempotency: retryable store conflict")
	// ErrLeaseLost: the caller's reservation expired and was taken over
	// before it completed (stores with leases, such as Redis). Nothing the
	// caller queued on its transaction was applied.
	ErrLeaseLost = errors.New("idempotency: reservation lease lost")
	// ErrNotFound: the store holds no record for the key (Guard.Inspect,
	// Guard.Forget).
	ErrNotFound = errors.New("idempotency: no record for this key")
)

// ErrSchema: the store's table is missing, or lacks a column this version
// needs: it was never migrated, Config's table name has a typo, the
// table is that of an older version, or the service connects to another
// database or schema than the one migrated. Stores wrap the database's
// "no such table" and "no such column" errors of their own statements with
// it; the message names the table (or the column) and says to run the
// store's Migrate or apply its Schema. Guard.CheckSchema returns it
// before a service serves.
//
// It is a configuration error, not a transient failure: retrying does not
// help until the schema is fixed, so it is never wrapped in ErrStore
// (whose message says a retry is safe). Nothing was written: the key is
// not taken, fn did not run, and after the migration the same key runs as
// a new one. [Event].Outcome is [Failed]; idemhttp answers it with 500,
// not 503 with Retry-After.
var ErrSchema = errors.New("idempotency: the store's schema is missing or out of date")
