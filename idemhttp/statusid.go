package idemhttp

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"

	"github.com/go-idempotency/idempotency"
)

// minStatusSecretLen is the shortest secret [AsyncOptions].Secrets
// accepts, in bytes.
const minStatusSecretLen = 32

// statusIDVersion is the first byte of every sealed status id.
const statusIDVersion = 1

// statusIDs turns a key into the id of its status resource and back. The id
// is the key's id sealed with AES-256-GCM under a key derived from a secret
// of [AsyncOptions].Secrets, the scope as additional data: it shows nothing
// of the key, cannot be made without the secret, and opens only in the
// key's scope. Its nonce is a MAC of the scope and id, so one key always
// gets the same id (a retry's Location is the first one's), in every
// process configured with the same secret.
type statusIDs struct {
	keys []statusKey // the first seals; every one opens
}

type statusKey struct {
	aead  cipher.AEAD
	nonce []byte // the key of the MAC that makes the nonce
}

// newStatusIDs derives the keys of secrets; it refuses none or a short one.
func newStatusIDs(secrets [][]byte) (*statusIDs, error) {
	if len(secrets) == 0 {
		return nil, fmt.Errorf("%w: idemhttp: AsyncOptions.Secrets is empty: the status resource's id seals the key with a secret "+
			"of at least %d random bytes, the same in every instance of the service", idempotency.ErrInvalidConfig, minStatusSecretLen)
	}
	s := &statusIDs{}
	for i, secret := range secrets {
		if len(secret) < minStatusSecretLen {
			return nil, fmt.Errorf("%w: idemhttp: AsyncOptions.Secrets[%d] is %d bytes; want at least %d random bytes",
				idempotency.ErrInvalidConfig, i, len(secret), minStatusSecretLen)
		}
		block, err := aes.NewCipher(derive(secret, "idemhttp status id: encryption"))
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		s.keys = append(s.keys, statusKey{aead: aead, nonce: derive(secret, "idemhttp status id: nonce")})
	}
	return s, nil
}

// derive returns the 32-byte key of secret for purpose.
func derive(secret []byte, purpose string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(purpose))
	return m.Sum(nil)
}

// additional is the data a status id is bound to: the version and the
// key's scope, length-prefixed.
func additional(scope string) []byte {
	ad := make([]byte, 0, 1+8+len(scope))
	ad = append(ad, statusIDVersion)
	ad = binary.BigEndian.AppendUint64(ad, uint64(len(scope)))
	return append(ad, scope...)
}

// seal returns the status id of k: URL-safe base64, no padding.
func (s *statusIDs) seal(k idempotency.Key) string {
	key := s.keys[0]
	ad := additional(k.Scope)
	m := hmac.New(sha256.New, key.nonce)
	m.Write(ad)
	m.Write([]byte(k.ID))
	nonce := m.Sum(nil)[:key.aead.NonceSize()]
	out := append([]byte{statusIDVersion}, nonce...)
	out = key.aead.Seal(out, nonce, []byte(k.ID), ad)
	return base64.RawURLEncoding.EncodeToString(out)
}

// open returns the key id sealed in the status id id for scope; false for
// an id that no secret opens in this scope (forged, of another scope, or
// sealed with a secret no longer configured).
func (s *statusIDs) open(scope, id string) (string, bool) {
	raw, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil || len(raw) < 1 || raw[0] != statusIDVersion {
		return "", false
	}
	raw = raw[1:]
	ad := additional(scope)
	for _, key := range s.keys {
		n := key.aead.NonceSize()
		if len(raw) < n+key.aead.Overhead() {
			return "", false
		}
		if plain, err := key.aead.Open(nil, raw[:n], raw[n:], ad); err == nil {
			return string(plain), true
		}
	}
	return "", false
}
