package backend

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
)

// DerivedKeyLen is the length in bytes of every key returned by
// [Key.Derive]: 52.
const DerivedKeyLen = 52

// deriveDomain separates derived keys from every other use of SHA-256 in
// and outside this package; "v1" names the encoding below.
const deriveDomain = "go-idempotency/derive/v1"

// derivedEncoding is RFC 4648 base32 in lower case, without padding.
var derivedEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Derive returns a key for one external call made on behalf of the
// operation keyed by k. Pass it to a provider that deduplicates on it: the
// Idempotency-Key header of a payment API, the message id of a broker or an
// email service. The purpose names the call within the operation
// ("charge", "email", "step", "3", ...). One operation that makes two
// calls gives each its own purpose.
//
// The result is a pure function of k.Scope, k.ID and purpose. The same
// inputs give the same key in every attempt, every process and every
// version of this package. So a retry of fn that repeats the call sends
// the provider the key it saw the first time.
//
// Different inputs give different keys: another purpose, another id or
// another scope (two tenants using the same id). No shift of bytes between
// the parts can make two inputs meet, as the parts are length-prefixed
// before they are hashed. (Key{"ab", "c"} and Key{"a", "bc"} differ, and
// so do purposes ("a", "bc") and ("ab", "c").) A collision would be a
// SHA-256 collision.
//
// The key is [DerivedKeyLen] (52) characters of lower-case base32 (a to z
// and 2 to 7), unchanged by case folding. It fits the value space of an
// HTTP header, a URL path segment, an Idempotency-Key ([Key.ID] accepts
// it) and the 255 characters Stripe allows. It is
//
//	base32lower(SHA-256("go-idempotency/derive/v1" ||
//	    u64(len(scope)) || scope || u64(len(id)) || id ||
//	    u64(len(purpose)) || for each p: u64(len(p)) || p))
//
// with u64 an unsigned 64-bit big-endian integer and base32lower RFC 4648
// base32 in lower case without padding.
//
// Derive never fails and works on any bytes; it does not validate k. The
// hash is not keyed: anyone who can guess the scope, the id and the purpose
// can compute the key, so a derived key is an identifier, not a secret.
func (k Key) Derive(purpose ...string) string {
	h := sha256.New()
	var n [8]byte
	put := func(s string) {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	h.Write([]byte(deriveDomain))
	put(k.Scope)
	put(k.ID)
	binary.BigEndian.PutUint64(n[:], uint64(len(purpose)))
	h.Write(n[:])
	for _, p := range purpose {
		put(p)
	}
	var sum [sha256.Size]byte
	return derivedEncoding.EncodeToString(h.Sum(sum[:0]))
}
