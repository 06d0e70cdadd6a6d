package sealed

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"fmt"

	"github.com/go-idempotency/idempotency"
)

// KeySize is the length of every key of a [Keyring]: AES-256.
const KeySize = 32

// MaxKeyIDLen is the longest key id of a [Keyring].
const MaxKeyIDLen = 64

// Keyring names the keys of a [Codec]. Rotate by adding a new key and
// making it Current once every instance has it; keep an old key in the
// ring as long as records sealed with it may be replayed (the Guard's
// TTL after it stopped being current), then remove it.
type Keyring struct {
	// Keys maps each key id (1 to [MaxKeyIDLen] bytes of printable ASCII,
	// no space) to its [KeySize] bytes. The ids are stored with each
	// record in clear; the keys never are.
	Keys map[string][]byte
	// Current is the id of the key that seals new records.
	Current string
	// AcceptPlain makes Open return records stored without this codec
	// (before sealing was turned on) as they are, instead of failing with
	// [ErrNotSealed], and OpenData the input and data of operations left
	// unfinished then. Turn it on while such records may still be
	// replayed, for one TTL (and until such operations have finished).
	// What a Guard stored sealed ([idempotency.StoredSealed]) is never
	// taken for plain: damaged, or sealed by another codec, it fails.
	AcceptPlain bool
}

// Codec seals answers with AES-256-GCM ([New]). It is safe for
// concurrent use.
//
// A sealed record keeps its status in clear: HTTP answers a replay by it
// before it reads the body, and operators read it ([idempotency.Guard].Inspect,
// the store's own queries) to tell successes from refusals without a key.
// The status is authenticated with the record's key as additional data,
// so changing it in the table makes the record fail to open. The stored
// header is empty; the body is:
//
//	"\x00ISA" | len(id) (1 byte) | id | nonce (12 bytes) | ciphertext | tag (16 bytes)
//
// where the plaintext is the headers (a count of names, then each name,
// sorted, with a count of its values and each value, every string
// prefixed by its length as a uvarint) followed by the body, and the
// additional data is the prefix up to the id, the status (2 bytes, big
// endian) and the key's scope and id (each prefixed by its length). Each
// seal takes a fresh random nonce: seal at most 2^32 answers with one key
// (rotate well before).
type Codec struct {
	current     string
	aeads       map[string]cipher.AEAD
	acceptPlain bool
}

// New returns a Codec for kr. A key of the wrong size, an invalid id or a
// Current that is not in Keys gives an error wrapping
// [idempotency.ErrInvalidConfig]. The keys are copied.
func New(kr Keyring) (*Codec, error) {
	if len(kr.Keys) == 0 {
		return nil, fmt.Errorf("%w: sealed: the keyring has no key", idempotency.ErrInvalidConfig)
	}
	c := &Codec{current: kr.Current, aeads: make(map[string]cipher.AEAD, len(kr.Keys)), acceptPlain: kr.AcceptPlain}
	for id, key := range kr.Keys {
		if err := checkKeyID(id); err != nil {
			return nil, fmt.Errorf("%w: sealed: key id %q: %w", idempotency.ErrInvalidConfig, id, err)
		}
		if len(key) != KeySize {
			return nil, fmt.Errorf("%w: sealed: key %q has %d bytes, want %d (AES-256)", idempotency.ErrInvalidConfig, id, len(key), KeySize)
		}
		block, err := aes.NewCipher(key) // copies the key into its schedule
		if err != nil {
			return nil, fmt.Errorf("%w: sealed: key %q: %w", idempotency.ErrInvalidConfig, id, err)
		}
		aead, err := cipher.NewGCMWithRandomNonce(block)
		if err != nil {
			return nil, fmt.Errorf("%w: sealed: key %q: %w", idempotency.ErrInvalidConfig, id, err)
		}
		c.aeads[id] = aead
	}
	if _, ok := c.aeads[kr.Current]; !ok {
		return nil, fmt.Errorf("%w: sealed: the current key %q is not in the keyring", idempotency.ErrInvalidConfig, kr.Current)
	}
	return c, nil
}

func checkKeyID(id string) error {
	if id == "" || len(id) > MaxKeyIDLen {
		return fmt.Errorf("%d bytes, want 1 to %d", len(id), MaxKeyIDLen)
	}
	for i := range len(id) {
		if id[i] <= ' ' || id[i] > '~' {
			return fmt.Errorf("byte %d is %#02x, not printable ASCII without space", i, id[i])
		}
	}
	return nil
}

// prefix is the part of a sealed body of kind before the nonce.
func prefix(kind byte, id string) []byte {
	p := make([]byte, 0, len(magic)+2+len(id))
	p = append(p, magic...)
	p = append(p, kind, byte(len(id)))
	return append(p, id...)
}

// seal encrypts plain with the current key under the prefix of kind,
// authenticated with key and status.
func (c *Codec) seal(kind byte, key idempotency.Key, status int, plain []byte) []byte {
	aead := c.aeads[c.current]
	p := prefix(kind, c.current)
	out := make([]byte, len(p), len(p)+aead.NonceSize()+len(plain)+aead.Overhead())
	copy(out, p)
	return aead.Seal(out, nil, plain, additionalData(p, key, status))
}

// open decrypts what seal made of kind, with the key its id names.
func (c *Codec) open(key idempotency.Key, status int, sealed []byte) ([]byte, error) {
	id, ct, err := parseAEAD(sealed)
	if err != nil {
		return nil, err
	}
	aead, ok := c.aeads[id]
	if !ok {
		return nil, fmt.Errorf("%w: key id %q", ErrUnknownKey, id)
	}
	p := sealed[:len(sealed)-len(ct)]
	plain, err := aead.Open(nil, nil, ct, additionalData(p, key, status))
	if err != nil {
		return nil, fmt.Errorf("%w: key id %q: %w", ErrCorrupt, id, err)
	}
	return plain, nil
}

// Seal encrypts resp's headers and body with the current key, bound to
// key and resp's status.
func (c *Codec) Seal(_ context.Context, key idempotency.Key, resp idempotency.Response) (idempotency.Response, error) {
	if resp.Status < 100 || resp.Status > 599 {
		return idempotency.Response{}, fmt.Errorf("sealed: status %d outside 100..599", resp.Status)
	}
	plain := appendHeader(nil, resp.Header)
	plain = append(plain, resp.Body...)
	return idempotency.Response{Status: resp.Status, Body: c.seal(kindAEAD, key, resp.Status, plain)}, nil
}

// Open decrypts a record Seal stored for key, with the key its id names.
func (c *Codec) Open(ctx context.Context, key idempotency.Key, stored idempotency.Response) (idempotency.Response, error) {
	if kindOf(stored.Body) != kindAEAD {
		if passPlain(ctx, c.acceptPlain, stored.Body) {
			return stored, nil
		}
		return idempotency.Response{}, ErrNotSealed
	}
	if stored.Status < 100 || stored.Status > 599 {
		return idempotency.Response{}, fmt.Errorf("%w: status %d", ErrCorrupt, stored.Status)
	}
	plain, err := c.open(key, stored.Status, stored.Body)
	if err != nil {
		return idempotency.Response{}, err
	}
	r := &reader{b: plain}
	h := r.header()
	if r.err != nil {
		return idempotency.Response{}, r.err
	}
	return idempotency.Response{Status: stored.Status, Header: h, Body: plainBody(r.b)}, nil
}

// SealData encrypts an unfinished operation's input and step data with
// the current key, bound to key (the SealData of an [idempotency.Codec]). The result is
//
//	"\x00ISD" | len(id) (1 byte) | id | nonce (12 bytes) | ciphertext | tag (16 bytes)
//
// authenticated, as an answer is, with the prefix up to the id and the
// key's scope and id (the status slot is zero).
func (c *Codec) SealData(_ context.Context, key idempotency.Key, data []byte) ([]byte, error) {
	return c.seal(kindData, key, 0, data), nil
}

// OpenData decrypts what SealData sealed for key. Data stored in clear
// (by a Guard without a codec) is refused with [ErrNotSealed], or, with
// [Keyring].AcceptPlain, returned as it is unless the Guard stored it
// sealed ([idempotency.StoredSealed]).
func (c *Codec) OpenData(ctx context.Context, key idempotency.Key, sealed []byte) ([]byte, error) {
	if kindOf(sealed) != kindData {
		if passPlain(ctx, c.acceptPlain, sealed) {
			return sealed, nil
		}
		return nil, ErrNotSealed
	}
	return c.open(key, 0, sealed)
}

// KeyID returns the id of the key that sealed a stored body, for tools
// that find the records still sealed with a key about to be removed.
func KeyID(body []byte) (string, error) {
	if k := kindOf(body); k != kindAEAD && k != kindData {
		return "", ErrNotSealed
	}
	id, _, err := parseAEAD(body)
	return id, err
}

// parseAEAD splits a sealed body into its key id and the nonce with the
// ciphertext and tag.
func parseAEAD(body []byte) (id string, ct []byte, err error) {
	rest := body[len(magic)+1:]
	if len(rest) < 1 {
		return "", nil, fmt.Errorf("%w: truncated before the key id", ErrCorrupt)
	}
	n := int(rest[0])
	rest = rest[1:]
	if n == 0 || n > MaxKeyIDLen || len(rest) < n {
		return "", nil, fmt.Errorf("%w: bad key id length %d", ErrCorrupt, n)
	}
	id, ct = string(rest[:n]), rest[n:]
	if err := checkKeyID(id); err != nil {
		return "", nil, fmt.Errorf("%w: key id: %w", ErrCorrupt, err)
	}
	if len(ct) < 12+16 { // nonce and tag
		return "", nil, fmt.Errorf("%w: truncated ciphertext", ErrCorrupt)
	}
	return id, ct, nil
}
