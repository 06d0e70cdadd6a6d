package backend

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"unicode/utf8"

	"github.com/go-idempotency/idempotency/internal/ascii"
)

// Limits on keys and fingerprints.
const (
	// MaxIDLen is the longest key id, in bytes.
	MaxIDLen = 255
	// MaxScopeLen is the longest key scope, in bytes.
	MaxScopeLen = 255
	// MaxFingerprintLen is the longest fingerprint, in bytes.
	MaxFingerprintLen = 255
)

// Key identifies one logical operation. Two keys are the same only if both
// Scope and ID are byte-equal: the same ID in two scopes never meet.
type Key struct {
	// Scope partitions keys, e.g. by client or account: up to 255 bytes of
	// valid UTF-8 without NUL. It may be empty.
	Scope string
	// ID is the client's idempotency key: 1 to 255 bytes of printable ASCII
	// (0x20 to 0x7E), the value space of the Idempotency-Key header.
	ID string
}

// Validate reports whether k is acceptable, with an error wrapping
// [ErrInvalidKey] if not.
func (k Key) Validate() error {
	switch {
	case len(k.ID) == 0:
		return fmt.Errorf("%w: id is empty", ErrInvalidKey)
	case len(k.ID) > MaxIDLen:
		return fmt.Errorf("%w: id is %d bytes, longer than %d", ErrInvalidKey, len(k.ID), MaxIDLen)
	case len(k.Scope) > MaxScopeLen:
		return fmt.Errorf("%w: scope is %d bytes, longer than %d", ErrInvalidKey, len(k.Scope), MaxScopeLen)
	case !utf8.ValidString(k.Scope):
		return fmt.Errorf("%w: scope is not valid UTF-8", ErrInvalidKey)
	}
	if i := ascii.IndexNotPrintable(k.ID); i >= 0 {
		return fmt.Errorf("%w: id byte %d is %#02x, not printable ASCII", ErrInvalidKey, i, k.ID[i])
	}
	for i := 0; i < len(k.Scope); i++ {
		if k.Scope[i] == 0 {
			return fmt.Errorf("%w: scope contains NUL at byte %d", ErrInvalidKey, i)
		}
	}
	return nil
}

// HashLen is the length of [Key.Hash], in hex digits (64 bits).
const HashLen = 16

// Hash returns a short digest of k that names it in logs and error strings
// without showing it. It is the first [HashLen] hex digits of the SHA-256
// of the scope's length (8 bytes, big-endian), the scope and the id. The
// length prefix makes it unambiguous: ("a", "b/c") and ("a/b", "c")
// differ. It is stable across processes, versions of this package and
// stores.
//
// It cannot be reversed. But a key that can be guessed (a short counter
// such as "order-42") can be found by hashing guesses: it hides a random
// key (a UUID), not a predictable one. Two keys share a hash by chance with
// probability about n²/2⁶⁵ among n keys (one in 37 million for a million
// keys). That is enough to find a key's lines in logs, not to identify a
// record.
func (k Key) Hash() string {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(k.Scope)))
	h.Write(n[:])
	h.Write([]byte(k.Scope))
	h.Write([]byte(k.ID))
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:HashLen/2])
}

// String returns "#" and [Key.Hash], so that printing a Key (with %v, %s
// or in a log line) never shows its scope or id; read the fields for them.
// (encoding/json still encodes the fields: a Key marshalled to JSON is the
// key itself.)
func (k Key) String() string { return "#" + k.Hash() }

// LogValue makes [log/slog] log a Key as its [Key.String], whatever the
// handler (a JSON handler would otherwise log its fields).
func (k Key) LogValue() slog.Value { return slog.StringValue(k.String()) }

// KeyError is the error Guard.Do returns for a call that reached the
// store or waited for its key. That is every error but the validation of
// its arguments and fn's own error, which Do returns as fn returned it. Its
// text names the key by its [Key.Hash] only; code gets the raw key with
// errors.As. It unwraps to the cause, so errors.Is finds every sentinel
// (ErrMismatch, [ErrInProgress], ErrStore...) as before.
type KeyError struct {
	// Key is the key of the call, scope and id as the caller passed them.
	Key Key
	// Err is the cause.
	Err error
}

// Error returns the cause's text followed by the key's hash, or the
// cause's text alone when it names the hash already (stores' errors do).
func (e *KeyError) Error() string {
	msg := e.Err.Error()
	h := e.Key.Hash()
	if strings.Contains(msg, h) {
		return msg
	}
	return msg + " (key #" + h + ")"
}

// Unwrap returns the cause.
func (e *KeyError) Unwrap() error { return e.Err }
