// Package redis is the Redis backend of the idempotency library: an
// [idempotency.KeyStore] over a go-redis [goredis.UniversalClient] (a single
// node, Sentinel or Cluster).
//
// # UNSAFE FOR ATOMIC EFFECTS outside Redis
//
// Redis cannot share a transaction with another store. The key and an effect
// performed anywhere else (a charge written to PostgreSQL, a call to a
// payment API) are never committed together. If the process dies after the
// effect and before the response is stored, the key stays reserved only
// until its lease expires; then a retry reserves the key again and runs the
// effect a second time. Nothing in this package can prevent that duplicate:
// use a SQL backend when the effect lives in that SQL database.
//
// Redis is still the right choice when:
//
//   - the effects live in Redis itself and are queued on the [Tx] pipeline
//     that fn receives: they are sent in the same MULTI/EXEC as the stored
//     response, and only if the caller still owns the key, so they commit
//     atomically with it or not at all;
//   - the effect is itself idempotent downstream, for example when the key is
//     forwarded to a payment provider that deduplicates on it: a second run
//     after a lost lease is then harmless, and this store only saves work;
//   - the operation is expensive but harmless to repeat, and the store is a
//     cache of its responses.
//
// # Records, leases and waiting
//
// Each key is a Redis hash under Config.Prefix. A reservation writes it as
// pending, with a random owner token, and gives it a lease (Config.Lease,
// 30s by default) that a timer of the reservation renews every third of the
// lease while fn runs, by compare-and-set on the token; no goroutine runs
// between renewals, and none is left once Complete or Rollback returns. A
// holder that dies stops renewing; Redis deletes the pending record when
// the lease runs out, and the key is free again.
//
// Complete (see [idempotency.Txn]) watches the record (WATCH), checks that the token is still
// the caller's, and sends fn's queued commands, the completed record, its
// expiry and a wake-up PUBLISH in one MULTI/EXEC. If the lease was lost
// (expired and taken over), nothing is applied and Complete returns an error
// wrapping [idempotency.ErrLeaseLost]. A completed record keeps the
// reservation's ExpiresAt and gets a Redis expiry of the TTL (measured on the
// Redis clock from its completion), so it vanishes by itself:
// [Store.Purge] always returns 0. A completed record whose ExpiresAt is not
// after the core's clock counts as absent and is taken over atomically.
//
// Callers of one key in one [Store] that arrive while another of them runs
// the reservation script wait for its answer instead of sending their own.
// A caller that finds a key pending waits for the holder's completion or
// rollback, for its lease to run out, or for its wait bound or context to
// end. When the holder is a reservation of the same Store (Redis names
// the owner token), the caller waits on it in memory and, if it completed,
// takes a copy of the record it stored, without asking Redis again.
// Otherwise the caller subscribes to a channel of the key before it looks
// at it again (no lost wake-up) and is woken by the holder's PUBLISH; it
// holds one pub/sub connection meanwhile, which go-redis dials outside its
// command pool. Polling (a tenth of the lease, between 50ms and 1s) is only
// a fallback for a lost message.
//
// # Round trips
//
// A Do with a new key costs three round trips on a single node or Sentinel
// (the reservation script; WATCH with the token check; MULTI, fn's
// commands, the record, EXPIRE, PUBLISH, EXEC) and four on Cluster, where
// go-redis sends WATCH on its own. A replay costs one (the reservation
// script returns the completed record). The bare effect, fn's commands in a
// plain MULTI/EXEC, costs one. Redis has no conditional EXEC: a script
// queued in the MULTI cannot stop fn's commands, so the token is checked
// under WATCH and its answer must be back before EXEC is sent. Only a WATCH
// armed in the reservation's own round trip would save one, at the price of
// pinning a pooled connection for fn's whole run and of one more round trip
// (UNWATCH) on every replay, so this store does not do it.
//
// Replication in Redis is asynchronous: a failover (Sentinel, Cluster) can
// lose the latest writes, so a key completed just before it can come back
// as new, and a lost reservation lets a second caller in. Configure
// persistence and failover with that in mind.
//
// Redis applies every command of a MULTI/EXEC even when one of them fails at
// run time (for example INCR on a value that is not a number): the record is
// then completed with the others and Complete returns that command's error.
//
// # Keys and Redis Cluster
//
// All keys of one record share one hash tag, derived from a hash of its
// scope and id (so braces in either are harmless): the record, its wake-up
// channel and every key that [Tx.Key] names. On Cluster everything in one
// MULTI/EXEC must live in one hash slot, so fn must only touch keys named by
// [Tx.Key]. If Config.Prefix itself contains a hash tag, such as
// "app:{idem}:", that tag wins and every key of the store lives in one slot:
// fn may then also touch any key that carries the same tag, at the price of
// putting the whole store on one node.
package redis
