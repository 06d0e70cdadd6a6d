package backend

import (
	"context"
	"fmt"
	"math"
	"time"
)

// QuotaCounter is an optional interface of a idempotency.KeyStore: per-scope counters
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
