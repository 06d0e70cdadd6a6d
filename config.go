package idempotency

import (
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency/observe"
)

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
	// retried within the default 30s.
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
	// most one minute.
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
	Observer observe.Observer
	// Codec, if set, seals every answer before it is stored and opens
	// every answer replayed from the store (see [Codec]; package sealed
	// encrypts answers, or stores a resource id instead of the body).
	Codec Codec
}

// Defaults of [Config].
const (
	defaultTTL          = 24 * time.Hour
	defaultWaitTimeout  = 30 * time.Second
	defaultMaxRetries   = 10
	defaultRetryBackoff = 2 * time.Millisecond
	defaultPurgeBatch   = 1000
	defaultMaxWaiters   = 2
	// maxRetryBackoff is the longest [Config.RetryBackoff] accepted.
	maxRetryBackoff = time.Minute
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
	case c.RetryBackoff > maxRetryBackoff:
		return nil, fmt.Errorf("%w: RetryBackoff %v longer than %v", ErrInvalidConfig, c.RetryBackoff, maxRetryBackoff)
	case c.PurgeBatch < 0:
		return nil, fmt.Errorf("%w: negative PurgeBatch %d", ErrInvalidConfig, c.PurgeBatch)
	}
	if c.TTL == 0 {
		c.TTL = defaultTTL
	}
	noWait := c.WaitTimeout < 0
	if c.WaitTimeout <= 0 {
		c.WaitTimeout = defaultWaitTimeout // also the bound of a no-wait call's retries
	}
	if c.MaxRetries < 0 {
		c.MaxRetries = 0 // no retries
	} else if c.MaxRetries == 0 {
		c.MaxRetries = defaultMaxRetries
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = defaultRetryBackoff
	}
	if c.PurgeBatch == 0 {
		c.PurgeBatch = defaultPurgeBatch
	}
	var waiters chan struct{} // nil: no bound
	switch {
	case c.MaxWaiters < 0:
	case c.MaxWaiters == 0:
		c.MaxWaiters = defaultMaxWaiters
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
// the default TTL (24h); a TTL [New] would refuse gives an error wrapping
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
		ttl = defaultTTL
	}
	v := *g
	v.cfg.TTL = ttl
	return &v, nil
}

// TTL returns how long g keeps the answers it completes: [Config.TTL] (or
// its default), or the TTL given to [Guard.WithTTL].
func (g *Guard[Tx]) TTL() time.Duration { return g.cfg.TTL }
