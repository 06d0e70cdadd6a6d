package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/go-idempotency/idempotency/internal/canonical"
)

// FingerprintJSON returns the hex SHA-256 of the canonical form of the JSON
// value in data (keys sorted, whitespace dropped, strings and numbers in one notation each, duplicate keys refused). Two requests get the same fingerprint
// exactly when they hold the same JSON value, whatever their key order,
// insignificant whitespace, string escapes or number notation. Invalid JSON
// gives an error wrapping [ErrInvalidBody].
func FingerprintJSON(data []byte) (string, error) {
	c, err := canonical.JSON(data)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:]), nil
}

// Fingerprint returns the hex SHA-256 of parts, each length-prefixed so that
// moving bytes from one part to the next changes the result. Use it to
// fingerprint a request made of several fields (method, route, body).
func Fingerprint(parts ...[]byte) string {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// FingerprintForm returns the hex SHA-256 of the canonical form of the
// application/x-www-form-urlencoded body in data (parameters grouped by name in byte order, each name's values in their order, percent-encoding normalized). Two
// bodies get the same fingerprint exactly when they hold the same
// parameters, in the same order under each name, whatever the order of the
// names and however their bytes are percent-encoded. A body net/url refuses
// gives an error wrapping [ErrInvalidBody].
func FingerprintForm(data []byte) (string, error) {
	c, err := canonical.Form(data)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:]), nil
}
