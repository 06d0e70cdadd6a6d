// Package sealed provides [idempotency.Codec]s for the answers a Guard
// stores ([idempotency.Config].Codec):
//
//   - [New] encrypts them at rest with AES-256-GCM under a [Keyring] of
//     named keys: the status stays in clear (authenticated), the headers
//     and the body are encrypted, and the record's key (scope and id) is
//     bound to it as additional data, so a sealed answer copied to
//     another key does not open. Keys rotate: a record names the key that
//     sealed it, and opens as long as that key is in the ring.
//   - [NewReference] stores no body at all: only the status, the headers
//     you allow and the id of the resource the answer is about, and
//     re-renders the answer from the resource's current state on replay.
//   - [Chain] combines them (a reference whose id and headers are
//     encrypted).
//
// A record a codec cannot open (an unknown key id, a record tampered with
// or moved to another key, one stored in clear) fails the call with
// [idempotency.ErrCodec] and the codec's error ([ErrUnknownKey],
// [ErrCorrupt], [ErrNotSealed]): the replay fails closed and the
// operation never runs again. The key and the fingerprint are never
// sealed: look-ups stay exact.
package sealed
