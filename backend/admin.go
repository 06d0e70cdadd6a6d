package backend

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// KeyAdmin is an optional interface of a idempotency.KeyStore: what an operator needs
// to look at one key and release it. Every store of this module implements
// it. Guard.Inspect and Guard.Forget validate the key first and call
// it.
type KeyAdmin interface {
	// Inspect returns what the store holds for key, with its body only if
	// body is true (BodyLen is always set). A key with no record gives an
	// error wrapping [ErrNotFound]. It takes no lock and waits for none.
	// A store that holds a new key in an open transaction with no row
	// visible to others (PostgreSQL) reports it [KeyInProgress] if it can tell
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

// KeyLister is an optional interface of a idempotency.KeyStore that can enumerate
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
	// KeyInProgress: a call of Guard.Do holds the key in an open transaction,
	// or a run of an Operation holds its live lease.
	KeyInProgress KeyState = iota + 1
	// KeyCompleted: the key's answer is stored and replayed.
	KeyCompleted
	// KeyUnfinished: an operation stopped between two steps and nobody
	// holds it: a retry with the key or the Completer resumes it.
	KeyUnfinished
	// KeyExpired: past its expiry by the store's clock, not yet purged; it
	// counts as absent.
	KeyExpired
)

// String returns "in_progress", "completed", "unfinished" or "expired".
func (s KeyState) String() string {
	switch s {
	case KeyInProgress:
		return "in_progress"
	case KeyCompleted:
		return "completed"
	case KeyUnfinished:
		return "unfinished"
	case KeyExpired:
		return "expired"
	}
	return fmt.Sprintf("KeyState(%d)", int(s))
}

// KeyInfo is what a store holds for one key, as [KeyAdmin.Inspect],
// [KeyAdmin.Forget] and [KeyLister.List] report it. The core decodes
// Progress for its users (the operation's name, step and last failure).
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
	// InProgress counts what Inspect reports [KeyInProgress] from committed state:
	// the unfinished keys whose lease lives, and on a lease store the
	// reservations whose lease lives. A key held only by an open
	// transaction, with no committed row, need not be counted.
	InProgress                     int64
	Completed, Unfinished, Expired int64
	// OldestUnfinished is the creation of the oldest unfinished or held
	// operation, zero when there is none.
	OldestUnfinished time.Time
	// Failing counts the unfinished keys with at least one failed try.
	Failing int64
	// BodyBytes sums the bodies of live completed records.
	BodyBytes int64
}

// MaxListLimit is the largest page Guard.List returns.
const MaxListLimit = 1000
