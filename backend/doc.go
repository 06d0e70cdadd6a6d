// Package backend is the contract a key store implements for package
// idempotency: the types the methods of idempotency.KeyStore take and
// return ([Reservation], [Txn], [Record]), the optional capabilities a
// store may offer ([Stepper] for multi-step operations, [KeyAdmin] and
// [KeyLister] for operators, [QuotaCounter] for quotas, [Migrator] and
// [SchemaChecker] for a schema of its own, [ConflictClassifier] for fn's
// own conflicts), the errors a store wraps, and the helpers only a store
// calls ([Expiry], [CheckClock], [CheckProgress], [MarshalHeader]).
//
// It is to package idempotency what database/sql/driver is to
// database/sql: users of a Guard never need it. A store author starts at
// idempotency.KeyStore, whose documentation gives the rules every store
// follows and the steps of writing one, then reads this package's types,
// each with the rules of its methods; package conformance runs the suite
// that checks them.
//
// [Key] and [Response] are the two types a user and a store share:
// package idempotency names them too (idempotency.Key is this Key).
package backend
