package idempotency

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrOverQuota: a scope reached a limit of its [Quota]; nothing was
// written. (HTTP 429.)
var ErrOverQuota = errors.New("idempotency: over quota")

// Bounds of [Quota].Window.
const (
	MinQuotaWindow = time.Second
	MaxQuotaWindow = 24 * time.Hour
)

// Quota limits what the keys of one scope may do in a fixed window of
// time: how many new keys are admitted, how many run at once, and how many
// bytes of answers are stored. The counters are kept in the store (see
// [QuotaCounter]), so every instance of a service shares them.
//
// Windows are fixed: each starts at a multiple of Window since the Unix
// epoch, by the store's clock, and counts from zero. A scope can use its
// whole quota at the end of one window and again at the start of the
// next: up to twice a limit within one Window across a boundary.
//
// A zero limit means no limit; at least one limit must be set.
type Quota struct {
	// Window is the length of a window: a whole number of seconds from
	// [MinQuotaWindow] to [MaxQuotaWindow].
	Window time.Duration
	// MaxKeys is how many new keys a scope may start per window. A replay
	// of a completed, live key is not counted; a request that stores no
	// answer (rolled back, refused, or answered from another caller's
	// record) stops counting when it ends.
	MaxKeys int64
	// MaxInFlight is how many admitted keys of a scope may run at once, as
	// counted in the current window: a request counts until it ends or
	// its window ends, whichever is first.
	MaxInFlight int64
	// MaxBytes: once the bodies of the answers a scope stored in the
	// window reach MaxBytes, its new keys are refused until the window
	// ends. The answer that crosses the limit is stored.
	MaxBytes int64
}

// Validate returns an error wrapping [ErrInvalidConfig] unless q is a
// usable quota.
func (q *Quota) Validate() error {
	switch {
	case q == nil:
		return fmt.Errorf("%w: nil Quota", ErrInvalidConfig)
	case q.Window < MinQuotaWindow || q.Window > MaxQuotaWindow || q.Window%time.Second != 0:
		return fmt.Errorf("%w: Quota.Window %v: want whole seconds from %v to %v", ErrInvalidConfig, q.Window, MinQuotaWindow, MaxQuotaWindow)
	case q.MaxKeys < 0 || q.MaxInFlight < 0 || q.MaxBytes < 0:
		return fmt.Errorf("%w: Quota limits must not be negative (MaxKeys %d, MaxInFlight %d, MaxBytes %d)", ErrInvalidConfig, q.MaxKeys, q.MaxInFlight, q.MaxBytes)
	case q.MaxKeys == 0 && q.MaxInFlight == 0 && q.MaxBytes == 0:
		return fmt.Errorf("%w: Quota sets no limit", ErrInvalidConfig)
	}
	return nil
}

// Limits returns the three limits with "no limit" (0) as [math.MaxInt64],
// as a store compares them: keys, in flight, bytes.
func (q Quota) Limits() (keys, inFlight, bytes int64) {
	l := func(n int64) int64 {
		if n == 0 {
			return math.MaxInt64
		}
		return n
	}
	return l(q.MaxKeys), l(q.MaxInFlight), l(q.MaxBytes)
}

// QuotaLimit names the limit of a [Quota] that refused a key.
type QuotaLimit int

// The limits of a [Quota].
const (
	// QuotaKeys: MaxKeys new keys were counted in the window.
	QuotaKeys QuotaLimit = iota + 1
	// QuotaInFlight: MaxInFlight keys were running.
	QuotaInFlight
	// QuotaBytes: MaxBytes bytes of answers were stored in the window.
	QuotaBytes
)

// String returns the limit as a metrics label: "keys", "in_flight" or
// "bytes".
func (l QuotaLimit) String() string {
	switch l {
	case QuotaKeys:
		return "keys"
	case QuotaInFlight:
		return "in_flight"
	case QuotaBytes:
		return "bytes"
	}
	return fmt.Sprintf("QuotaLimit(%d)", int(l))
}

// QuotaError is the error of a key refused by its scope's [Quota]: it
// wraps [ErrOverQuota].
type QuotaError struct {
	// Key is the refused key; its %v prints its hash only.
	Key Key
	// Limit is the limit that was reached.
	Limit QuotaLimit
	// RetryAfter is the time left until the window ends, by the store's
	// clock.
	RetryAfter time.Duration
}

// Error names the key by its hash, the limit and the time to wait.
func (e *QuotaError) Error() string {
	return fmt.Sprintf("idempotency: key %v: over quota (%s), window ends in %v", e.Key, e.Limit, e.RetryAfter)
}

// Unwrap returns [ErrOverQuota].
func (e *QuotaError) Unwrap() error { return ErrOverQuota }

// Admit checks key against its scope's quota q in one round trip to the
// store, before [Guard.Do] takes a connection. It returns:
//
//   - (adm, nil) with adm.Counted: the key is counted as new and in
//     flight; call [Guard.EndQuota] with adm once the request ended.
//   - (adm, nil) with adm.Replay: the key is completed and live; nothing
//     was counted, and Do will replay it.
//   - an error wrapping [ErrOverQuota] (a *[QuotaError]): a limit was
//     reached; nothing was counted nor written.
//
// An invalid key or quota is refused with [ErrInvalidKey] or
// [ErrInvalidConfig] before the store is asked. The store must implement
// [QuotaCounter] (every store of this module does); others give an error
// wrapping [errors.ErrUnsupported]. A store conflict (a serialization
// failure of racing admissions) is retried with backoff, up to
// [Config].MaxRetries, as Do retries one. A store failure wraps [ErrStore].
func (g *Guard[Tx]) Admit(ctx context.Context, key Key, q *Quota) (QuotaAdmission, error) {
	if err := key.Validate(); err != nil {
		return QuotaAdmission{}, err
	}
	if err := q.Validate(); err != nil {
		return QuotaAdmission{}, err
	}
	qc, ok := g.store.(QuotaCounter)
	if !ok {
		return QuotaAdmission{}, unsupported(g.store, "QuotaCounter")
	}
	adm, err := qc.AdmitQuota(ctx, QuotaCheck{Key: key, Quota: *q})
	// A conflict counted nothing (the store's rule): retry it as Do
	// retries one, so racing admissions of one scope under REPEATABLE
	// READ or SERIALIZABLE are not refused with an error none needs.
	for n := 1; errors.Is(err, ErrConflict) && n <= g.cfg.MaxRetries; n++ {
		if serr := sleep(ctx, backoff(g.cfg.RetryBackoff, n)); serr != nil {
			break
		}
		adm, err = qc.AdmitQuota(ctx, QuotaCheck{Key: key, Quota: *q})
	}
	if err != nil {
		err, _ = storeError(ctx, err)
		return QuotaAdmission{}, &KeyError{Key: key, Err: err}
	}
	if adm.Over != 0 {
		return adm, &QuotaError{Key: key, Limit: adm.Over, RetryAfter: adm.RetryAfter}
	}
	return adm, nil
}

// EndQuota ends an admission of [Guard.Admit] that was counted: created
// says whether the request stored an answer with key, bytes how large its
// body was. It is one short statement of the store; an admission not
// counted (a replay) is ignored.
func (g *Guard[Tx]) EndQuota(ctx context.Context, key Key, q *Quota, adm QuotaAdmission, created bool, bytes int64) error {
	if !adm.Counted {
		return nil
	}
	if err := q.Validate(); err != nil {
		return err
	}
	qc, ok := g.store.(QuotaCounter)
	if !ok {
		return unsupported(g.store, "QuotaCounter")
	}
	err := qc.EndQuota(ctx, QuotaEnd{Scope: key.Scope, Window: q.Window, WindowStart: adm.WindowStart, Created: created, Bytes: max(0, bytes)})
	if err != nil {
		err, _ = storeError(ctx, err)
		return &KeyError{Key: key, Err: err}
	}
	return nil
}

// PurgeQuota deletes the counters of windows that ended, in batches of
// [Config.PurgeBatch], until a batch comes back short or ctx ends, and
// returns how many it deleted. Run it with [Guard.Purge]. A store without
// [QuotaCounter] gives 0 and no error.
func (g *Guard[Tx]) PurgeQuota(ctx context.Context) (int, error) {
	qc, ok := g.store.(QuotaCounter)
	if !ok {
		return 0, nil
	}
	total := 0
	for {
		n, err := qc.PurgeQuota(ctx, g.cfg.PurgeBatch)
		total += n
		if err != nil {
			err, _ = storeError(ctx, err)
			return total, err
		}
		if n < g.cfg.PurgeBatch {
			return total, nil
		}
	}
}
