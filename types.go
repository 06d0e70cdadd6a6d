package idempotency

import "github.com/go-idempotency/idempotency/backend"

// Key identifies one logical operation: a Scope (a client, an account:
// up to 255 bytes of UTF-8 without NUL, possibly empty) and an ID (the
// client's idempotency key: 1 to 255 bytes of printable ASCII). Two keys
// are the same only if both are byte-equal. Key.Validate checks it,
// Key.Hash names it in logs (fmt's %v prints "#" and the hash, never the
// raw key), Key.Derive gives the idempotency key of a call to another
// service. Stores see the very same type: it is defined in package
// backend, with those methods.
type Key = backend.Key

// Response is what an operation answered: Status (100 to 599), Header and
// Body are stored with the key when the operation commits and replayed
// byte-exact to every later caller with the same key and fingerprint;
// Replayed, TTL and ExpiresAt describe the call that returned it and are
// never stored. Stores see the very same type, defined in package backend.
type Response = backend.Response
