package backend

import (
	"net/http"
	"time"
)

// Response is what an operation answered: stored with the key when the
// operation commits, and replayed byte-exact to every later caller with the
// same key and fingerprint.
type Response struct {
	// Status is an HTTP-style status code, 100 to 599.
	Status int
	// Header holds response headers to replay; it may be nil.
	Header http.Header
	// Body is stored and replayed byte-exact; it may be nil or binary.
	Body []byte
	// Replayed is false when this call ran fn, true when the response was
	// read back from the store.
	Replayed bool
	// TTL and ExpiresAt say how long the key keeps this answer. They are
	// set by Guard.Do on the answers it returns, never stored and never
	// compared: the stored answer is Status, Header and Body, and what fn
	// puts in these two fields is ignored.
	//
	// TTL is the lifetime the answer's record was completed with: the
	// Guard's (Config.TTL or Guard.WithTTL) when this call ran fn, or
	// the leading call's when the answer was handed in memory by the call
	// of the same key that ran fn. Stores do not keep the TTL: for a replay
	// read from the store it is the TTL of the Guard that read it, and the
	// record may have been completed by a view with another; ExpiresAt is
	// then the one to trust.
	TTL time.Duration
	// ExpiresAt is when the key stops answering this response. For a
	// replay read from the store it is the record's expiry, exact, by the
	// store's clock ([Record].ExpiresAt). For an executed call (and an
	// answer handed in memory by one) it is an estimate: the application's
	// clock read just before [Txn.Complete], plus the TTL, rounded down to
	// the millisecond and clamped as [Expiry] clamps. When the
	// application's and the store's clocks agree it is no later than the
	// store's expiry, so a client that stops retrying by it never retries
	// after the key expired. Zero when unknown.
	ExpiresAt time.Time
}
