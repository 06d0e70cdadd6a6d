package idempotency

import (
	"net/http"
	"time"

	"github.com/go-idempotency/idempotency/backend"
)

// KeyState says what the store holds for a key.
type KeyState int

// The states of a key, as [KeyInfo].State reports them.
const (
	// KeyInProgress: a call holds the key (its fn is running), or a run of
	// an [Operation] holds its live lease. Callers of the key wait, or get
	// [ErrInProgress].
	KeyInProgress KeyState = KeyState(backend.KeyInProgress)
	// KeyCompleted: the key's answer is stored and replayed.
	KeyCompleted KeyState = KeyState(backend.KeyCompleted)
	// KeyUnfinished: an operation stopped between two steps and nobody
	// holds it: a retry with the key or the [Completer] resumes it.
	KeyUnfinished KeyState = KeyState(backend.KeyUnfinished)
	// KeyExpired: past its expiry by the store's clock, not yet purged; it
	// counts as absent.
	KeyExpired KeyState = KeyState(backend.KeyExpired)
)

// String returns "in_progress", "completed", "unfinished" or "expired".
func (s KeyState) String() string { return backend.KeyState(s).String() }

// KeyInfo is what the store holds for one key, as [Guard.Inspect],
// [Guard.Forget] and [Guard.List] report it.
type KeyInfo struct {
	Key         Key
	State       KeyState
	Fingerprint string
	// Status, Header and Body are the stored answer (completed or expired
	// keys); Body only when asked for, opened by [Config].Codec if sealed.
	Status  int
	Header  http.Header
	Body    []byte
	BodyLen int
	// CreatedAt and ExpiresAt are by the store's clock. ExpiresAt is zero
	// when the store cannot tell (a key held in a transaction with no row
	// yet) and the year 2262 for an unfinished operation, which never
	// expires.
	CreatedAt time.Time
	ExpiresAt time.Time
	// Operation, Step and Failure describe an unfinished operation: its
	// name, the step it resumes at, and the error of its last failed run
	// ("" if none). Tries counts its failed runs; LeaseEnds is when the
	// lease of the run that holds it ends (zero if none).
	Operation string
	Step      string
	Failure   string
	Tries     int
	LeaseEnds time.Time
	// Sealed reports that the stored answer, or the operation's input and
	// step data, were sealed by a [Codec]. A Guard without a Codec leaves
	// a sealed Body nil: it never shows the sealed bytes.
	Sealed bool
}

// ListQuery selects one page of [Guard.List].
type ListQuery struct {
	// Scope is the exact scope whose keys are listed.
	Scope string
	// Limit is the page's size: 1 to 1000.
	Limit int
	// After is the Next of the page before; nil starts from the first key.
	After *backend.ListCursor
}

// KeyPage is one page of [Guard.List].
type KeyPage struct {
	Keys []KeyInfo
	// Next resumes the listing (as the next ListQuery's After); nil when
	// this page is the last.
	Next *backend.ListCursor
}

// Stats counts the store's records by state ([Guard.Stats]).
type Stats struct {
	// InProgress counts the keys [KeyInProgress] in committed state: the
	// operations whose lease lives, and on a lease store (Redis) the calls
	// whose lease lives. A call running in a transaction with no committed
	// row yet may not be counted.
	InProgress                     int64
	Completed, Unfinished, Expired int64
	// OldestUnfinished is the creation of the oldest unfinished or
	// in-progress operation, zero when there is none.
	OldestUnfinished time.Time
	// Failing counts the unfinished keys with at least one failed try.
	Failing int64
	// BodyBytes sums the bodies of live completed records.
	BodyBytes int64
}

// SchemaCheck says what [Guard.CheckSchema] verifies besides the keys
// table.
type SchemaCheck struct {
	// Quota: the service uses quotas ([Guard.AdmitQuota], idemhttp's
	// Config.Quota), so the store's quota table must exist too. A service
	// without quotas may have applied Schema without the quota table's
	// DDL; it leaves Quota false.
	Quota bool
}

// infoOf is the user's view of what a store reported for a key, with the
// fields the core decodes from its progress.
func infoOf(b *backend.KeyInfo) *KeyInfo {
	if b == nil {
		return nil
	}
	info := &KeyInfo{
		Key: b.Key, State: KeyState(b.State), Fingerprint: b.Fingerprint,
		Status: b.Status, Header: b.Header, Body: b.Body, BodyLen: b.BodyLen,
		CreatedAt: b.CreatedAt, ExpiresAt: b.ExpiresAt, Tries: b.Tries, LeaseEnds: b.LeaseEnds,
	}
	if info.Sealed = isSealed(info.Header); info.Sealed {
		info.Header = unsealedHeader(info.Header)
	}
	if b.Progress == nil {
		return info
	}
	p, err := decodeProgress(b.Progress)
	info.Sealed = info.Sealed || err == nil && p.sealed != nil
	if err != nil {
		info.Failure = err.Error()
		return info
	}
	info.Operation, info.Step, info.Failure = p.Op, p.Step, p.Failure
	if info.Step == "" {
		info.Step = "Finish"
	}
	return info
}
