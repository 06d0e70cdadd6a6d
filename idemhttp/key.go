package idemhttp

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"

	"github.com/go-idempotency/idempotency"
)

// DefaultKeyHeader is the request header that carries the key, the
// draft's: the default of [Options].KeyHeader and [Transport].KeyHeader.
const DefaultKeyHeader = "Idempotency-Key"

// HeaderReplayed is set to "true" on responses replayed from the store.
const HeaderReplayed = "Idempotent-Replayed"

// HeaderKeyExpires is the response header that says until when the server
// remembers the request's key: an IMF-fixdate (RFC 9110, as Expires and
// Retry-After carry), rounded down to the second, so that a retry sent
// before it is answered from the key, never run again. It is on the
// first answer stored with a key (an estimate no later than the store's
// expiry) and on every replay (the stored record's expiry), and on the "in
// progress" problem, where it is a lower bound: the key's holder has not
// answered yet, and its answer will be kept at least the route's TTL from
// the moment this request arrived. [Transport] stops retrying by it.
// docs/http.md says why an instant rather than a number of seconds.
const HeaderKeyExpires = "Idempotency-Key-Expires"

// parseKey returns the key id carried by one Idempotency-Key field value.
// The draft makes the value an RFC 8941 sf-string ("abc", where \" and \\
// are the only escapes); most clients send the bare value, which is taken
// as it is. Surrounding spaces and tabs are ignored. Parameters after a
// quoted string are not accepted. The id's own limits are checked by
// [idempotency.Key.Validate]. Every error wraps [idempotency.ErrInvalidKey].
func parseKey(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if !strings.HasPrefix(v, `"`) {
		return v, nil
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			i++
			if i == len(v) {
				return "", fmt.Errorf("%w: sf-string ends inside an escape", idempotency.ErrInvalidKey)
			}
			if v[i] != '"' && v[i] != '\\' {
				return "", fmt.Errorf("%w: sf-string has the invalid escape \\%c", idempotency.ErrInvalidKey, v[i])
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: sf-string is followed by more data", idempotency.ErrInvalidKey)
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: sf-string byte %d is %#02x, not printable ASCII", idempotency.ErrInvalidKey, i, c)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("%w: sf-string has no closing quote", idempotency.ErrInvalidKey)
}

// NewKeyID returns a fresh random key id, for a client to send in the
// key header: a version 4 UUID from crypto/rand.
func NewKeyID() string {
	var u [16]byte
	_, _ = rand.Read(u[:]) // crypto/rand.Read never fails (it crashes the program instead)
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

// quoteKey writes id as an sf-string, the form the draft specifies.
func quoteKey(id string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(id) + `"`
}

// MinKeyLength returns a [Options].ValidateKey that refuses keys shorter
// than n bytes: a cheap guard against low-entropy keys ("1", "order").
func MinKeyLength(n int) func(id string) error {
	return func(id string) error {
		if len(id) < n {
			return fmt.Errorf("the key is %d bytes; at least %d are required (use a random UUID)", len(id), n)
		}
		return nil
	}
}

// UUIDKey is a [Options].ValidateKey that accepts only UUIDs (8-4-4-4-12
// hexadecimal digits, any version, either case), the key form the draft
// suggests. It refuses anything else with a *[Problem] (400
// ProblemInvalidKey) whose detail says what is wrong and that a UUID is
// wanted, so that the answer asks for a UUID only.
func UUIDKey(id string) error {
	if reason := notUUID(id); reason != "" {
		return &Problem{Type: problemInvalidKey, Title: "The idempotency key is not a UUID", Status: http.StatusBadRequest,
			Detail: "The key " + reason + "; send a UUID: 36 characters, 8-4-4-4-12 hexadecimal digits, such as 8e03978e-40d5-43e8-bc93-6894a57f9324."}
	}
	return nil
}

// notUUID says why id is not a UUID, or "".
func notUUID(id string) string {
	if len(id) != 36 {
		unit := "bytes"
		if len(id) == 1 {
			unit = "byte"
		}
		return fmt.Sprintf("is %d %s, not the 36 of a UUID", len(id), unit)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return fmt.Sprintf("has %q at byte %d, where a UUID has '-'", c, i)
			}
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f', 'A' <= c && c <= 'F':
		default:
			return fmt.Sprintf("has %q at byte %d, not a hexadecimal digit", c, i)
		}
	}
	return ""
}
