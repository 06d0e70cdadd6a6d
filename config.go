package idempotency

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"
)

// MaxExpiry is the latest expiry a record can have: the latest instant a
// signed 64-bit count of Unix nanoseconds can hold (2262-04-11). The store's
// clock plus the TTL is clamped to it, so a TTL such as math.MaxInt64 means
// "never expire" on every store. A clock reading at or after it is refused
// with [ErrInvalidConfig].
func MaxExpiry() time.Time { return time.Unix(0, math.MaxInt64).UTC() }

// MinClock is the earliest clock reading a store accepts (1677-09-21,
// the earliest instant of a signed 64-bit count of Unix nanoseconds); an
// earlier reading is refused with [ErrInvalidConfig]. Only a store's test
// clock can be out of range; see [CheckClock].
func MinClock() time.Time { return time.Unix(0, math.MinInt64).UTC() }

// Outcome says how a guarded operation ended: a call of [Guard.Do] (see
// [Event]) or a request an integration such as idemhttp answered.
type Outcome int

// The outcomes an [Observer] is told about. [Guard.Do] reports the first
// five, [Operation.Run] Unfinished too, [Guard.Forget] Forgotten and the
// [Completer] Exhausted; the others are those of integrations that tell
// more apart.
const (
	// Executed: fn ran and its response was committed with the key.
	Executed Outcome = iota + 1
	// Replayed: a stored response was returned; fn did not run.
	Replayed
	// Mismatch: the key was used with another fingerprint.
	Mismatch
	// InProgress: the key was held by another caller past the wait bound.
	InProgress
	// Failed: fn, the store or validation returned an error.
	Failed
	// NotStored: fn ran and gave an answer that is not stored (an HTTP
	// 400 or 409): sent, its writes rolled back, the key left free.
	NotStored
	// HandlerError: fn failed, panicked or gave no answer; its writes were
	// rolled back and the key left free.
	HandlerError
	// Rejected: the request was refused before the store was reached (a
	// missing or invalid key, an invalid body).
	Rejected
	// StoreError: the key store failed ([ErrStore]); fn did not run or
	// was rolled back.
	StoreError
	// Canceled: the caller went away before an answer; nothing was stored.
	Canceled
	// Internal: the integration is misconfigured, so the request was
	// refused without running fn.
	Internal
	// Unfinished: a run of an [Operation] stopped at a step after a
	// transient failure; the key resumes on a retry or in the [Completer].
	Unfinished
	// Forgotten: an operator deleted the key ([Guard.Forget]); the next
	// call with it runs fn again, as for a new key.
	Forgotten
	// Exhausted: the [Completer] gave up on an unfinished operation after
	// its MaxTries failed runs. The key stays unfinished (never purged) for
	// an operator to inspect, finish by a retry, or forget.
	Exhausted
	// OverQuota: the request was refused by its scope's [Quota] before
	// anything was written.
	OverQuota
)

// String returns the outcome as a metrics label: "executed", "replayed",
// "mismatch", "in_progress", "failed", "not_stored", "handler_error",
// "rejected", "store_error", "canceled", "internal", "unfinished",
// "forgotten", "exhausted" or "over_quota".
func (o Outcome) String() string {
	switch o {
	case Executed:
		return "executed"
	case Replayed:
		return "replayed"
	case Mismatch:
		return "mismatch"
	case InProgress:
		return "in_progress"
	case Failed:
		return "failed"
	case NotStored:
		return "not_stored"
	case HandlerError:
		return "handler_error"
	case Rejected:
		return "rejected"
	case StoreError:
		return "store_error"
	case Canceled:
		return "canceled"
	case Internal:
		return "internal"
	case Unfinished:
		return "unfinished"
	case Forgotten:
		return "forgotten"
	case Exhausted:
		return "exhausted"
	case OverQuota:
		return "over_quota"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Event describes one finished call of [Guard.Do].
//
// Log a call by [Event.KeyHash], not by Key's fields: the raw key is a
// client's secret-ish input (and often personal data), and log lines
// outlive it. Neither the key nor its hash may be a metric label: each
// call has its own, so a label would grow the metric without bound; label
// metrics by Outcome.
type Event struct {
	// Key is the call's key as the caller passed it. Printing it (%v, slog)
	// shows its hash only; see [Key.String].
	Key      Key
	Outcome  Outcome
	Duration time.Duration
	// Attempts counts reservations tried, retries of [ErrConflict] included.
	Attempts int
	// Err is the error Do returned, nil for Executed and Replayed.
	Err error
	// Operation and Step name the [Operation] of a call of [Operation.Run]
	// or of the [Completer], and the step it stopped at (its last step
	// when it finished); both are "" for a call of [Guard.Do].
	Operation string
	Step      string
}

// KeyHash returns [Key.Hash] of the call's key: the name of the key in
// logs and in the text of Do's errors. Not a metric label: see [Event].
func (e Event) KeyHash() string { return e.Key.Hash() }

// LogValue makes [log/slog] log an Event as a group of its key's hash
// (key_hash), outcome, duration, attempts and error, never the raw key.
func (e Event) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.String("key_hash", e.KeyHash()),
		slog.String("outcome", e.Outcome.String()),
		slog.Duration("duration", e.Duration),
		slog.Int("attempts", e.Attempts),
	}
	if e.Operation != "" {
		attrs = append(attrs, slog.String("operation", e.Operation), slog.String("step", e.Step))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	return slog.GroupValue(attrs...)
}

// Observer is told about every call of [Guard.Do] once it ends, on the
// calling goroutine. It must not block for long.
type Observer func(ctx context.Context, ev Event)

// Config tunes a [Guard]. The zero value (or nil) means the defaults.
type Config struct {
	// TTL is how long a completed key is remembered, counted by the store's
	// clock from the moment its answer was committed (however long fn
	// ran). After it the key counts as new. The application's clock never
	// judges expiry (see [KeyStore]). Expiries are clamped to [MaxExpiry], so
	// math.MaxInt64 means "never". Defaults to 24h.
	TTL time.Duration
	// WaitTimeout bounds how long Do waits for another caller holding the
	// same key before it returns [ErrInProgress]. Zero means the default,
	// 30s. The caller's context bounds it too.
	//
	// It bounds the whole call until fn runs, whatever the store reports
	// on the way. That covers every reservation attempt, the retries of
	// [ErrConflict] and their backoff, and the waits of a store for a lock.
	// (SQLite's one writer may be held by this process's callers of other
	// keys or by another process.) When it runs out, a key held gives
	// [ErrInProgress]. So does a key the store cannot tell from held
	// (SQLite's write lock taken by another process). A store still failing
	// with conflicts, on a key nobody is known to hold, gives [ErrStore]
	// with [ErrConflict]. The time fn runs is not counted: see [Guard.Do].
	//
	// A negative WaitTimeout means "do not wait". Do then returns
	// ErrInProgress at once instead of waiting for a caller that is running
	// fn with the same key. On SQLite it also does so when another process
	// holds the database's one write lock: that process may hold the key,
	// and SQLite cannot tell without waiting. Conflicts are then still
	// retried within [DefaultWaitTimeout].
	WaitTimeout time.Duration
	// MaxWaiters bounds how many calls of this Guard may wait inside the
	// store at once for keys held elsewhere (by another process or
	// Guard). Each such wait may hold one of the store's connections.
	// Beyond it, a call whose key is held returns [ErrInProgress] at once
	// (HTTP 409 with Retry-After), so waiters cannot take the pool from
	// other traffic. Callers of the same key in this Guard never count:
	// they wait in memory for the one that is in the store. Keep it well
	// under the pool size. Defaults to 2; a negative value means no bound.
	MaxWaiters int
	// MaxRetries bounds how many times a [ErrConflict] is retried within one
	// Do (until fn runs, within WaitTimeout too). Defaults to 10; a
	// negative value means no retries.
	MaxRetries int
	// RetryBackoff is the base of the exponential backoff (full jitter)
	// between retries, capped at 32 times the base. Defaults to 2ms; at
	// most [MaxRetryBackoff].
	RetryBackoff time.Duration
	// PurgeBatch is how many keys one batch of [Guard.Purge] deletes.
	// Defaults to 1000.
	PurgeBatch int
	// PurgePause is how long [Guard.Purge] pauses between two batches. Zero
	// (the default) pauses as long as the batch before took. A purge then
	// keeps its connection busy at most half the time, so the Do calls
	// meanwhile stay fast, and takes twice as long. A negative value means
	// no pause (batches back to back).
	PurgePause time.Duration
	// Observer, if set, is told about every call's outcome.
	Observer Observer
}

// Defaults of [Config].
const (
	DefaultTTL          = 24 * time.Hour
	DefaultWaitTimeout  = 30 * time.Second
	DefaultMaxRetries   = 10
	DefaultRetryBackoff = 2 * time.Millisecond
	DefaultPurgeBatch   = 1000
	DefaultMaxWaiters   = 2
	// MaxRetryBackoff is the longest [Config.RetryBackoff] accepted.
	MaxRetryBackoff = time.Minute
)

// New returns a Guard on store. A nil cfg means the defaults; a field out of
// range gives an error wrapping [ErrInvalidConfig].
//
// Build one Guard per Store. Its callers of one key wait in memory for the
// one among them that is in the store. Several Guards on one Store (or
// several processes on one database) stay correct: the store decides who
// gets a key. But each Guard keeps its own in-memory queue, so their
// callers of one key meet only in the store.
func New[Tx any](store KeyStore[Tx], cfg *Config) (*Guard[Tx], error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.TTL < 0:
		return nil, fmt.Errorf("%w: negative TTL %v", ErrInvalidConfig, c.TTL)
	case c.RetryBackoff < 0:
		return nil, fmt.Errorf("%w: negative RetryBackoff %v", ErrInvalidConfig, c.RetryBackoff)
	case c.RetryBackoff > MaxRetryBackoff:
		return nil, fmt.Errorf("%w: RetryBackoff %v longer than %v", ErrInvalidConfig, c.RetryBackoff, MaxRetryBackoff)
	case c.PurgeBatch < 0:
		return nil, fmt.Errorf("%w: negative PurgeBatch %d", ErrInvalidConfig, c.PurgeBatch)
	case c.TTL > 0 && c.TTL < time.Millisecond:
		return nil, fmt.Errorf("%w: TTL %v shorter than 1ms", ErrInvalidConfig, c.TTL)
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	noWait := c.WaitTimeout < 0
	if c.WaitTimeout <= 0 {
		c.WaitTimeout = DefaultWaitTimeout // also the bound of a no-wait call's retries
	}
	if c.MaxRetries < 0 {
		c.MaxRetries = 0 // no retries
	} else if c.MaxRetries == 0 {
		c.MaxRetries = DefaultMaxRetries
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = DefaultRetryBackoff
	}
	if c.PurgeBatch == 0 {
		c.PurgeBatch = DefaultPurgeBatch
	}
	var waiters chan struct{} // nil: no bound
	switch {
	case c.MaxWaiters < 0:
	case c.MaxWaiters == 0:
		c.MaxWaiters = DefaultMaxWaiters
		fallthrough
	default:
		waiters = make(chan struct{}, c.MaxWaiters)
	}
	return &Guard[Tx]{store: store, cfg: c, noWait: noWait, calls: make(map[Key]*call), waiters: waiters}, nil
}
