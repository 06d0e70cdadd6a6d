// Package redis is the Redis backend of the idempotency library. Its
// [Store] is an [idempotency.KeyStore] over a go-redis
// [goredis.UniversalClient]: a single node, Sentinel or Cluster.
//
// # UNSAFE FOR ATOMIC EFFECTS outside Redis
//
// Redis cannot share a transaction with another store. The key and an effect
// performed anywhere else (a charge written to PostgreSQL, a call to a
// payment API) are never committed together. If the process dies after the
// effect and before the response is stored, the key stays reserved only
// until its lease expires. Then a retry reserves the key again and runs the
// effect a second time. Nothing in this package can prevent that duplicate:
// use a SQL backend when the effect lives in that SQL database.
//
// Redis is still the right choice when:
//
//   - the effects live in Redis itself and are queued on the [Tx] pipeline
//     that fn receives. They are sent in the same MULTI/EXEC as the stored
//     response, and only if the caller still owns the key. So they commit
//     atomically with it or not at all.
//   - the effect is itself idempotent downstream. An example is a key
//     forwarded to a payment provider that deduplicates on it. A second run
//     after a lost lease is then harmless, and this store only saves work.
//   - the operation is expensive but harmless to repeat, and the store is a
//     cache of its responses.
//
// # Records, leases and waiting
//
// Each key is a Redis hash under [Config].Prefix. A reservation writes it as
// pending, with a random owner token. It gives it a lease ([Config].Lease,
// 30s by default). A timer of the reservation renews the lease every third
// of it while fn runs, by compare-and-set on the token. No goroutine runs
// between renewals, and none is left once Complete or Rollback returns. (A
// reservation that keeps its connection parks one goroutine on it.) A
// holder that dies stops renewing. Redis deletes the pending record when the
// lease runs out, and the key is free again.
//
// Complete (see [backend.Txn]) watches the record (WATCH) and checks
// that the token is still the caller's. Then it sends, in one MULTI/EXEC,
// fn's queued commands, the completed record, its expiry and a wake-up
// PUBLISH. If the lease was lost (expired and taken over), nothing is
// applied. Complete then returns an error wrapping
// [backend.ErrLeaseLost].
//
// A completed record expires the TTL after its completion, by Redis's own
// clock. That clock is TIME, read by the reservation script (and by the
// plain read of a key lately seen completed); [Config].Clock replaces it in
// tests. Complete moves the pending record's provisional expiry (its
// creation plus the TTL) on by the time its process measured since the
// script's reply (HINCRBY), so no command carries a time of the
// application, and the TTL never counts from a time later than Redis's
// clock at the EXEC. Every read checks the expiry. Redis deletes the
// record that long after its completion (at least a minute), so
// [Store.Purge] always returns 0. A completed record whose expiry is not
// after Redis's clock counts as absent, and is taken over atomically.
//
// A caller that finds a key pending waits for one of these: the holder's
// completion or rollback, the end of its lease, or the end of its own wait
// bound or context. The holder may be a reservation of the same Store
// (Redis names the owner token). Then the caller waits on it in memory. If
// it completed, the caller takes a copy of the record it stored, without
// asking Redis again.
//
// Otherwise the caller subscribes to a channel of the key before it looks at
// it again, so no wake-up is lost. The holder's PUBLISH wakes it. It holds
// one pub/sub connection meanwhile, which go-redis dials outside its command
// pool. Polling (a tenth of the lease, between 50ms and 1s) is only a
// fallback for a lost message.
//
// # Lost replies
//
// A reservation's reply may not arrive: the caller's deadline fires, or the
// connection is cut. The reservation may still have taken the key. Reserve
// then abandons it before it returns, best effort, on a context of its own.
// That is a compare-and-delete by token. It also marks a free key with the
// token: an "abandoned" record, free to any other token. So a reservation
// script still on its way reserves nothing when it arrives.
//
// If that fails too, the key stays pending under a token that nobody
// renews. The callers of the same Store know the token is over and take the
// key over at once. Callers elsewhere get it when the lease runs out.
// Rollback and a failed Complete release the key by the same
// compare-and-delete. The same Store's callers take over a key whose
// release failed.
//
// go-redis bounds a command by the caller's context only with the client
// option ContextTimeoutEnabled. Without it, a caller whose context ends
// still waits up to the client's ReadTimeout for a reply.
//
// # Round trips
//
// A new key costs two round trips on a single node or Sentinel, three on
// Cluster. A replay costs one or two. The bare effect, fn's commands in a
// plain MULTI/EXEC, costs one. See docs/performance.md for what each round
// trip carries.
//
// If the EXEC is refused (a lease renewal, a takeover), Complete checks the
// token again under a fresh WATCH and retries. A lost lease then gives
// [backend.ErrLeaseLost].
//
// Replication in Redis is asynchronous. A failover (Sentinel, Cluster) can
// lose the latest writes. So a key completed just before it can come back
// as new, and a lost reservation lets a second caller in. Configure
// persistence and failover with that in mind. [Config].WaitReplicas makes
// every answer wait until that many replicas have the record: a
// completion's (WAIT after its EXEC) and a replay's too. The reservation
// script that reads a completed record then also writes its state again
// (the same value), a write of the caller's own that the replication
// stream carries after the completion, and WAIT on that connection counts
// the replicas that have it (on Cluster and Ring a short script does it
// after the read, on the slot's master). Fewer give [ErrNotReplicated]
// instead of the answer. Without WaitReplicas replays cost what they did.
//
// Redis applies every command of a MULTI/EXEC even when one of them fails at
// run time (for example INCR on a value that is not a number). The record is
// then completed with the others, and Complete returns that command's error.
//
// # Keys and Redis Cluster
//
// All keys of one record share one hash tag: the record, its wake-up channel
// and every key that [Tx.Key] names. The tag is derived from a hash of the
// record's scope and id, so braces in either are harmless. On Cluster,
// everything in one MULTI/EXEC must live in one hash slot. So fn must only
// touch keys named by [Tx.Key].
//
// [Config].Prefix itself may contain a hash tag, such as "app:{idem}:". That
// tag then wins, and every key of the store lives in one slot. fn may then
// also touch any key that carries the same tag. The price is the whole store
// on one node.
//
// Slots may move while keys are held (resharding, CLUSTER FAILOVER).
// Complete sends WATCH, the owner check and MULTI/EXEC itself, on the node
// that holds the record. It sends ASKING when that node is importing the
// slot, and follows ASK and MOVED. It counts as applied only an EXEC that
// returned its replies.
//
// While a slot migrates, Redis runs a transaction naming keys that the node
// does not all have only after the hand-over (TRYAGAIN). Complete waits for
// that, up to half the lease. Otherwise it fails with a retryable conflict,
// nothing applied. The scripts name only the record, so reservations and
// replays run on whichever node has it meanwhile.
//
// # Key administration
//
// [Store] implements [backend.KeyAdmin]: [idempotency.Guard.Inspect]
// and [idempotency.Guard.Forget] look at one key and delete it, each in one
// script on the record's node. A pending record is reported held, and
// Forget refuses it with [idempotency.ErrInProgress]. An expired record is
// seen only until Redis deletes it, at least a minute after its completion.
//
// It does not implement [backend.KeyLister]: there is no listing of the
// keys of a scope, nor counts by state. The only way to enumerate them is
// SCAN over the key space of every node. On a Redis shared with other data,
// let alone a Cluster, that walks every key of the server, may return a key
// twice or miss one that moves, and is no snapshot. That is not a listing
// this package can promise. [idempotency.Guard.List] and
// [idempotency.Guard.Stats] return an error wrapping [errors.ErrUnsupported].
// Records expire by themselves, so there is nothing to purge either.
//
// # Multi-step operations
//
// [Store] does not implement [backend.Stepper], and
// [idempotency.Guard.Run] refuses it with an error wrapping
// [errors.ErrUnsupported]. An operation saves its progress in the same
// transaction as each step's effects, so that a crash resumes it at the
// last recovery point. Redis cannot share a transaction with effects kept
// anywhere else, so that promise would not hold: use a SQL store for
// operations.
package redis
