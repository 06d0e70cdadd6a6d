package idempotency

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Outcome says how a guarded operation ended: a call of [Guard.Do] (see
// [Event]) or a request an integration such as idemhttp answered.
type Outcome int

// The outcomes an [Observer] is told about. [Guard.Do] reports the first
// five, [Operation.Run] Unfinished too, [Guard.Forget] Forgotten and the
// [Completer] Exhausted, [Guard.Purge] Purged (one per batch); the others
// are those of integrations that tell more apart.
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
	// Purged: one batch of [Guard.Purge] ended; [Event].Deleted says how
	// many records it deleted, Duration how long it took, Err why it
	// failed (nil for a batch that succeeded).
	Purged
	// OverQuota: the request was refused by its scope's [Quota] before
	// anything was written.
	OverQuota
)

// String returns the outcome as a metrics label: "executed", "replayed",
// "mismatch", "in_progress", "failed", "not_stored", "handler_error",
// "rejected", "store_error", "canceled", "internal", "unfinished",
// "forgotten", "exhausted", "purged" or "over_quota".
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
	case Purged:
		return "purged"
	case OverQuota:
		return "over_quota"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Event describes one finished call of [Guard.Do], or of the other calls
// the [Outcome] constants name (one per batch of [Guard.Purge]).
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
	// Attempts counts reservations tried, retries of [backend.ErrConflict] included.
	Attempts int
	// TTL is the lifetime the Guard that handled the call gives the
	// answers it completes ([Config.TTL], or [Guard.WithTTL]'s): a label
	// of how long the route keeps its keys, not of this key.
	TTL time.Duration
	// Err is the error Do returned, nil for Executed and Replayed.
	Err error
	// Operation and Step name the [Operation] of a call of [Operation.Run]
	// or of the [Completer], and the step it stopped at (its last step
	// when it finished); both are "" for a call of [Guard.Do].
	Operation string
	Step      string

	// Waited is how long the call waited for another caller holding its
	// key: in memory behind the call of this Guard that was in the store,
	// and inside the store (each reservation given a wait, and each that
	// reported the key held, as SQLite's does after waiting for its one
	// write lock). A wait that ended in a replay has Outcome Replayed and
	// Waited > 0; one that ran out has Outcome InProgress. Zero for a
	// call that found the key free or completed.
	Waited time.Duration
	// RecordAge is, for a replay read from the store, how old the
	// replayed record is: the application's clock now minus the record's
	// CreatedAt (the store's clock when the key was reserved), zero if
	// the clocks make it negative. Zero for every other call, and for a
	// replay handed over in memory by the call that made the answer.
	RecordAge time.Duration
	// AfterFn: fn ran and returned an answer, and storing it failed (the
	// store's Complete returned the call's error: a cut connection, a
	// lost commit reply, a lease lost). The core cannot tell whether the
	// commit landed; a retry with the same key replays it or runs fn
	// once. Set only on a call that failed: Err wraps [ErrStore], or the
	// context's error when ctx ended during the commit.
	AfterFn bool
	// Deleted is how many records a batch of [Guard.Purge] deleted
	// (Outcome Purged); zero for other events.
	Deleted int
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
	if e.Waited > 0 {
		attrs = append(attrs, slog.Duration("waited", e.Waited))
	}
	if e.RecordAge > 0 {
		attrs = append(attrs, slog.Duration("record_age", e.RecordAge))
	}
	if e.AfterFn {
		attrs = append(attrs, slog.Bool("after_fn", true))
	}
	if e.Outcome == Purged {
		attrs = append(attrs, slog.Int("deleted", e.Deleted))
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
	// judges expiry (see [KeyStore]). Expiries are clamped to [backend.MaxExpiry], so
	// math.MaxInt64 means "never". Defaults to 24h.
	TTL time.Duration
	// WaitTimeout bounds how long Do waits for another caller holding the
	// same key before it returns [ErrInProgress]. Zero means the default,
	// 30s. The caller's context bounds it too.
	//
	// It bounds the whole call until fn runs, whatever the store reports
	// on the way. That covers every reservation attempt, the retries of
	// [backend.ErrConflict] and their backoff, and the waits of a store for a lock.
	// (SQLite's one writer may be held by this process's callers of other
	// keys or by another process.) When it runs out, a key held gives
	// [ErrInProgress]. So does a key the store cannot tell from held
	// (SQLite's write lock taken by another process). A store still failing
	// with conflicts, on a key nobody is known to hold, gives [ErrStore]
	// with [backend.ErrConflict]. The time fn runs is not counted: see [Guard.Do].
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
	// MaxRetries bounds how many times a [backend.ErrConflict] is retried within one
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
	// Codec, if set, seals every answer before it is stored and opens
	// every answer replayed from the store (see [Codec]; package sealed
	// encrypts answers, or stores a resource id instead of the body).
	Codec Codec
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
	if err := checkTTL(c.TTL); err != nil {
		return nil, err
	}
	switch {
	case c.RetryBackoff < 0:
		return nil, fmt.Errorf("%w: negative RetryBackoff %v", ErrInvalidConfig, c.RetryBackoff)
	case c.RetryBackoff > MaxRetryBackoff:
		return nil, fmt.Errorf("%w: RetryBackoff %v longer than %v", ErrInvalidConfig, c.RetryBackoff, MaxRetryBackoff)
	case c.PurgeBatch < 0:
		return nil, fmt.Errorf("%w: negative PurgeBatch %d", ErrInvalidConfig, c.PurgeBatch)
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
	fl := &flight{calls: make(map[Key]*call), waiters: waiters}
	return &Guard[Tx]{store: store, cfg: c, noWait: noWait, fl: fl}, nil
}

// checkTTL refuses a TTL that [New] refuses: negative, or positive and
// shorter than a millisecond. Zero means the default.
func checkTTL(ttl time.Duration) error {
	switch {
	case ttl < 0:
		return fmt.Errorf("%w: negative TTL %v", ErrInvalidConfig, ttl)
	case ttl > 0 && ttl < time.Millisecond:
		return fmt.Errorf("%w: TTL %v shorter than 1ms", ErrInvalidConfig, ttl)
	}
	return nil
}

// WithTTL returns a view of g that stores the answers it completes with
// ttl instead of [Config.TTL]: a route or an operation whose keys must be
// remembered longer (a payment: 72h) or shorter than the rest. Zero means
// [DefaultTTL]; a TTL [New] would refuse gives an error wrapping
// [ErrInvalidConfig].
//
// The view shares everything else with g: the store, the rest of the
// configuration (the Observer included) and the in-memory queue. Callers of
// one key through g and through the view wait for each other in memory,
// as callers of one Guard do, and share its [Config.MaxWaiters] slots. A
// key is one record whatever its TTL: a replay answers with the record as
// it was completed, by whichever view, and [Response].ExpiresAt says when
// that record expires. Build views once, at start-up, not per call.
func (g *Guard[Tx]) WithTTL(ttl time.Duration) (*Guard[Tx], error) {
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	if ttl == 0 {
		ttl = DefaultTTL
	}
	v := *g
	v.cfg.TTL = ttl
	return &v, nil
}

// TTL returns how long g keeps the answers it completes: [Config.TTL] (or
// its default), or the TTL given to [Guard.WithTTL].
func (g *Guard[Tx]) TTL() time.Duration { return g.cfg.TTL }
