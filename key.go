package idempotency

import (
	"fmt"
	"unicode/utf8"
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
	if i := indexNotPrintable(k.ID); i >= 0 {
		return fmt.Errorf("%w: id byte %d is %#02x, not printable ASCII", ErrInvalidKey, i, k.ID[i])
	}
	for i := 0; i < len(k.Scope); i++ {
		if k.Scope[i] == 0 {
			return fmt.Errorf("%w: scope contains NUL at byte %d", ErrInvalidKey, i)
		}
	}
	return nil
}

func validateFingerprint(fp string) error {
	switch {
	case len(fp) == 0:
		return fmt.Errorf("%w: empty", ErrInvalidFingerprint)
	case len(fp) > MaxFingerprintLen:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidFingerprint, len(fp), MaxFingerprintLen)
	}
	if i := indexNotPrintable(fp); i >= 0 {
		return fmt.Errorf("%w: byte %d is %#02x, not printable ASCII", ErrInvalidFingerprint, i, fp[i])
	}
	return nil
}

func indexNotPrintable(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return i
		}
	}
	return -1
}
