package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency/backend"
)

// ErrOverQuota: a scope reached a limit of its [Quota]; nothing was
// written. (HTTP 429.)
var ErrOverQuota = errors.New("idempotency: over quota")

// Quota limits what the keys of one scope may do in a fixed window of
// time: how many new keys are admitted, how many run at once, and how many
// bytes of answers are stored. The counters are kept in the store, so
// every instance of a service shares them.
//
// Windows are fixed: each starts at a multiple of Window since the Unix
// epoch, by the store's clock, and counts from zero. A scope can use its
// whole quota at the end of one window and again at the start of the
// next: up to twice a limit within one Window across a boundary.
//
// A zero limit means no limit; at least one limit must be set.
type Quota struct {
	// Window is the length of a window: a whole number of seconds from
	// one second to 24 hours.
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
func (q *Quota) Validate() error { return (*backend.Quota)(q).Validate() }

// QuotaAdmission is the answer of [Guard.AdmitQuota]: hand it to
// [Guard.EndQuota] when the request ends.
type QuotaAdmission struct {
	// Counted: the key was counted; end it with [Guard.EndQuota]. False
	// for a replay.
	Counted bool
	// Replay: the key's record is completed and live; nothing was counted.
	Replay bool
	// WindowStart is the start of the window the key counted in, by the
	// store's clock (zero for a replay).
	WindowStart time.Time
	// RetryAfter is the time left until the window ends, by the store's
	// clock (zero for a replay).
	RetryAfter time.Duration
}

// QuotaError is the error of a key refused by its scope's [Quota]: it
// wraps [ErrOverQuota].
type QuotaError struct {
	// Key is the refused key; its %v prints its hash only.
	Key Key
	// Limit is the limit that was reached, as a metrics label: "keys"
	// (MaxKeys), "in_flight" (MaxInFlight) or "bytes" (MaxBytes).
	Limit string
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

// AdmitQuota checks key against its scope's quota q in one round trip to the
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
// [backend.QuotaCounter] (every store of this module does); others give an error
// wrapping [errors.ErrUnsupported]. A store conflict (a serialization
// failure of racing admissions) is retried with backoff, up to
// [Config].MaxRetries, as Do retries one. A store failure wraps [ErrStore].
func (g *Guard[Tx]) AdmitQuota(ctx context.Context, key Key, q *Quota) (QuotaAdmission, error) {
	if err := key.Validate(); err != nil {
		return QuotaAdmission{}, err
	}
	if err := q.Validate(); err != nil {
		return QuotaAdmission{}, err
	}
	qc, ok := g.store.(backend.QuotaCounter)
	if !ok {
		return QuotaAdmission{}, unsupported(g.store, "backend.QuotaCounter")
	}
	adm, err := qc.AdmitQuota(ctx, backend.QuotaCheck{Key: key, Quota: backend.Quota(*q)})
	// A conflict counted nothing (the store's rule): retry it as Do
	// retries one, so racing admissions of one scope under REPEATABLE
	// READ or SERIALIZABLE are not refused with an error none needs.
	for n := 1; errors.Is(err, backend.ErrConflict) && n <= g.cfg.MaxRetries; n++ {
		if serr := sleep(ctx, backoff(g.cfg.RetryBackoff, n)); serr != nil {
			break
		}
		adm, err = qc.AdmitQuota(ctx, backend.QuotaCheck{Key: key, Quota: backend.Quota(*q)})
	}
	if err != nil {
		err, _ = storeError(ctx, err)
		return QuotaAdmission{}, &backend.KeyError{Key: key, Err: err}
	}
	if adm.Over != 0 {
		return QuotaAdmission{}, &QuotaError{Key: key, Limit: adm.Over.String(), RetryAfter: adm.RetryAfter}
	}
	return QuotaAdmission{Counted: adm.Counted, Replay: adm.Replay, WindowStart: adm.WindowStart, RetryAfter: adm.RetryAfter}, nil
}

// EndQuota ends an admission of [Guard.AdmitQuota] that was counted: created
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
	qc, ok := g.store.(backend.QuotaCounter)
	if !ok {
		return unsupported(g.store, "backend.QuotaCounter")
	}
	err := qc.EndQuota(ctx, backend.QuotaEnd{Scope: key.Scope, Window: q.Window, WindowStart: adm.WindowStart, Created: created, Bytes: max(0, bytes)})
	if err != nil {
		err, _ = storeError(ctx, err)
		return &backend.KeyError{Key: key, Err: err}
	}
	return nil
}

// PurgeQuota deletes the counters of windows that ended, in batches of
// [Config.PurgeBatch], until a batch comes back short or ctx ends, and
// returns how many it deleted. Run it with [Guard.Purge]. A store without
// [backend.QuotaCounter] gives 0 and no error.
func (g *Guard[Tx]) PurgeQuota(ctx context.Context) (int, error) {
	qc, ok := g.store.(backend.QuotaCounter)
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
