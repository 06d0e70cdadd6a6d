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
// between renewals, and none is left once Complete or Rollback returns
// (a reservation that keeps its connection parks one goroutine on it). A
// holder that dies stops renewing; Redis deletes the pending record when
// the lease runs out, and the key is free again.
//
// Complete (see [idempotency.Txn]) watches the record (WATCH), checks that
// the token is still the caller's, and sends fn's queued commands, the
// completed record, its expiry and a wake-up PUBLISH in one MULTI/EXEC. If
// the lease was lost (expired and taken over), nothing is applied and
// Complete returns an error wrapping [idempotency.ErrLeaseLost]. A
// completed record expires the TTL after its completion by Redis's own
// clock (TIME, read inside the scripts; [Config.Clock] replaces it in
// tests), and every read checks it; Redis deletes the record that long
// after its completion (at least a minute), so [Store.Purge] always
// returns 0. A completed record whose expiry is not after Redis's clock
// counts as absent and is taken over atomically.
//
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
// # Lost replies
//
// A reservation whose reply does not arrive (the caller's deadline fires,
// the connection is cut) may still have taken the key. Reserve then
// abandons it before it returns, best effort, on a context of its own: a
// compare-and-delete by token, which also marks a free key with the token
// (an "abandoned" record, free to any other token) so that a reservation
// script still on its way reserves nothing when it arrives. If
// that fails too, the key stays pending under a token that nobody renews:
// the callers of the same Store know the token is over and take the key
// over at once; callers elsewhere get it when the lease runs out. Rollback
// and a failed Complete release the key by the same compare-and-delete,
// and the same Store's callers take over a key whose release failed.
//
// go-redis bounds a command by the caller's context only with the client
// option ContextTimeoutEnabled; without it a caller whose context ends
// still waits up to the client's ReadTimeout for a reply.
//
// # Round trips
//
// On a single node or Sentinel ([goredis.Client]), a Do with a new key
// costs two round trips: the reservation script with WATCH on the record
// and a read of its owner, on a connection the reservation keeps while fn
// runs; then MULTI, fn's commands, the record, its expiry, PUBLISH and
// EXEC, which Redis refuses to apply if anything wrote to the record since
// the WATCH. The bare effect, fn's commands in a plain MULTI/EXEC, costs
// one. If the EXEC is refused (a lease renewal, a takeover), Complete
// checks the token again under a fresh WATCH and retries; a lost lease then
// gives [idempotency.ErrLeaseLost].
//
// A replay costs one round trip when the Store lately saw the key
// completed (it remembers a few thousand such keys), and two otherwise:
// the WATCH of a key found completed is cleared (UNWATCH) before its
// connection goes back to the pool. A caller that waits for a holder looks
// the key up with the plain script, which arms no WATCH. On Cluster, where
// keys move between nodes, the reservation is the plain script and
// Complete checks the token under WATCH first (WATCH and the check in one
// round trip): three round trips for a new key, one for a replay.
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
//
// Slots may move while keys are held (resharding, CLUSTER FAILOVER).
// Complete sends WATCH, the owner check and MULTI/EXEC itself, on the node
// that holds the record (with ASKING when that node is importing the slot),
// follows ASK and MOVED, and counts as applied only an EXEC that returned
// its replies. While a slot migrates, Redis runs a transaction naming keys
// that the node does not all have only after the hand-over (TRYAGAIN);
// Complete waits for that, up to half the lease, and otherwise fails with
// a retryable conflict, nothing applied. The scripts name only the record,
// so reservations and replays run on whichever node has it meanwhile.
package redis
