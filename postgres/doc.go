// Package postgres is the PostgreSQL [idempotency.KeyStore], on pgx/v5 and
// a *pgxpool.Pool. The transaction handle fn receives is a [pgx.Tx].
//
// A completed key is a row of one table (see [Schema]; [Store.Migrate]
// creates it) under a primary key on (scope, id). The row is written in the
// very transaction the effect runs in, so the effect, the key and the
// stored response commit together or not at all.
//
// # How a key is held
//
// [Store.Reserve] begins the transaction and takes a transaction-scoped
// advisory lock on a 64-bit hash of the table and the key
// (pg_advisory_xact_lock), which writes nothing; then, in a fresh statement
// that sees every transaction committed before the lock was granted, it
// reads the key's row. A live completed row is returned as the record. No
// row (or an expired one) means the key is the caller's: fn runs, and
// [idempotency.Txn.Complete] inserts the completed row (deleting the
// expired one first) in the same round trip as COMMIT. Every caller of the
// key takes the lock first, so no two of them hold the key at once; the
// primary key still guards it, and a unique violation there (a row written
// by something that did not take the lock) fails the commit with
// [idempotency.ErrConflict], so the attempt is rolled back and retried.
// Rolling back frees the key with the effect. Advisory locks taken by
// other code of the same database with 64-bit ids share the lock space: an
// id that happens to match a key's only makes the two wait for each other.
//
// # Round trips
//
// One call of [idempotency.Guard.Do] on one pooled connection costs, with
// the effect's own statements counted as one round trip:
//
//   - A new key: 3, as many as the bare effect transaction: BEGIN with the
//     lock and the look-up, the effect, the key row with COMMIT.
//   - A replay (a completed, live key): 2, the first round trip and a
//     ROLLBACK.
//   - A caller that waited for a key another process (or Guard) held: 4,
//     a first try and its ROLLBACK, then the wait, its look-up and a
//     ROLLBACK.
//
// A replay can cost 1 round trip instead: a plain look-up of the key,
// outside any transaction, sent before the first round trip, which a
// completed key then never needs. It makes a new key cost 4. The store
// sends it while most of its recent first tries (those of callers that did
// not wait for a held key) found a completed key, and stops once new keys
// dominate again, so that a stream of replays costs 1 round trip each and a
// stream of new keys 3 each. [Config.Lookup] sends it always
// ([idempotency.LookupAlways]) or never ([idempotency.LookupNever]).
//
// # Waiting
//
// A key held by another open transaction is reported at once with
// [idempotency.ErrInProgress] when the reservation must not wait (the
// core's first try, or a negative [idempotency.Config.WaitTimeout]). Otherwise Reserve waits
// for the lock under a lock_timeout (the wait bound, or the time left before
// ctx's deadline if that is shorter) that the statement sets before it waits
// and restores once it has the lock, so fn's statements keep the session's
// own lock_timeout. The session's statement_timeout bounds the wait too: a
// wait cut by either timeout (SQLSTATE 55P03 or 57014) is reported as
// [idempotency.ErrInProgress], with the server's error in the chain; the
// same codes met by any other statement of the store wrap
// [idempotency.ErrConflict] and are retried. A caller whose ctx ends while
// it waits gets ctx's error, never ErrInProgress.
//
// A Reserve whose ctx is cancelled while it waits returns at once and closes
// its connection (pgx's default reaction to a cancelled query, which also
// sends the server a cancel request); the pool replaces it, and the server
// session stops waiting.
//
// # Store failures
//
// A connection that fails under the store (cut, ended by the server) gives
// an error with the driver's error in the chain, to which
// [idempotency.Guard.Do] adds [idempotency.ErrStore]. A statement of fn that
// fails because its connection failed is wrapped with
// [idempotency.ErrStore] by the handle itself, so that fn's caller can tell
// it from fn's own failures: retrying with the same key is safe.
//
// A connection whose statement's ctx ended, or that failed, is closed at
// once: its socket is closed as soon as the store (or fn's handle) sees the
// error. pgx alone would close it in the background, after sending
// Terminate and waiting up to 15s for the server's end; if the Terminate
// never arrives (a reply lost on its way, a stalled path), the server's
// session, with its transaction and the key's lock, would live that long.
// Once the socket is closed, the server ends the session, rolls its
// transaction back and frees the key as soon as it reads the close, with no
// idle_in_transaction_session_timeout needed. A partition hides the close
// from the server: only that timeout (or TCP keepalives) ends the session
// then.
//
// # Isolation levels
//
// The store works under any isolation level ([Config.TxOptions] or the
// session's default). Under REPEATABLE READ and SERIALIZABLE the look-up
// would read a snapshot that may predate the lock, and under SERIALIZABLE
// its read would make callers of distinct keys fail each other: there the
// first round trip writes a pending key row instead of reading (still with
// the lock, still 3 round trips for a new key), and Complete stores the
// response on it. A row committed since the snapshot then fails with a
// serialization failure, which the store reports as
// [idempotency.ErrConflict] and [idempotency.Guard.Do] retries; the retry
// finds the completed key. When TxOptions does not name the level, the
// store starts with the read-committed way and switches for good at the
// first transaction that reports another level.
//
// # The transaction handle
//
// The [pgx.Tx] given to fn behaves like the one [pgxpool.Pool.Begin]
// returns (Exec, Query, QueryRow, SendBatch, CopyFrom, Prepare, Begin for a
// savepoint, Conn, LargeObjects) except at its ends: [idempotency.Guard.Do]
// commits it when fn returns, so Commit called from fn returns an error and
// commits nothing, and Rollback called from fn rolls everything back and
// makes Do fail. Once Do returns, the handle is closed: its methods return
// [pgx.ErrTxClosed] (a LargeObjects value is for use inside fn only). fn
// must not end the transaction with SQL of its own (COMMIT through Exec or
// through Conn): the key would then not be held.
//
// # Behind a transaction pooler
//
// The store's own statements depend on no session state (see
// docs/deployments.md in the repository): no SET but set_config(..., true)
// inside a statement, transaction-scoped advisory locks only, and no named
// prepared statement on a connection behind a pooler (PgBouncer in
// transaction mode, PgCat, RDS Proxy), which the store recognises at the
// connection's first reservation, without a round trip of its own: the
// server's process id differs from the one the connection's start-up
// reported. There it sends its batches as unnamed statements, whatever the
// pool's default exec mode. fn's statements use the pool's mode: behind
// such a pooler, add default_query_exec_mode=exec to the DSN. A statement
// of fn that lost a prepared statement of pgx's cache there fails with
// [ErrStatementCacheBehindPooler] in its chain.
//
// # Purge
//
// [Store.Purge] deletes the oldest expired rows, found through the
// expires_at index, in one short statement per batch, skipping rows that
// open transactions hold. Under READ COMMITTED a caller taking over an
// expired key holds it by its lock, not by the old row, which Purge may
// delete meanwhile; the caller's completion writes the key row anew.
package postgres
