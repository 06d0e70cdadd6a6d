// Package postgres is the PostgreSQL [idempotency.KeyStore], on pgx/v5 and
// a *pgxpool.Pool. The transaction handle fn receives is a [pgx.Tx].
//
// A key is a row of one table (see [Schema]; [Store.Migrate] creates it).
// [Store.Reserve] inserts the key's row in the very transaction the effect
// then runs in, so the effect, the key and the stored response commit
// together or not at all.
//
// # Round trips
//
// One call of [idempotency.Guard.Do] on one pooled connection costs, with
// the effect's own statements counted as one round trip:
//
//   - A replay (a completed, live key): 1, a plain SELECT outside any
//     transaction.
//   - A new key: 4, that look-up plus as many as the bare effect
//     transaction (BEGIN, the effect, COMMIT): the reservation, an INSERT
//     ... ON CONFLICT DO NOTHING, travels with BEGIN; the UPDATE that stores
//     the response travels with COMMIT.
//   - A caller that waited for another caller's key: once that caller has
//     committed, 1 more (the same ROLLBACK and SELECT).
//   - An expired key: taken over by an UPDATE in one more round trip.
//
// With [Config.SkipLookup] there is no look-up first: a new key costs 3
// round trips, exactly the bare transaction's, and a replay 2 (the INSERT
// finds the row; a ROLLBACK and a plain SELECT of the row follow in one
// round trip). Choose it when nearly every call carries a new key.
//
// Measured against the bare transaction the extra cost of a new key is not
// in round trips but in the server's work: writing the key row and then
// the response (an insert and a HOT update, with their WAL) and the few
// small functions that scope the wait bound.
//
// # Waiting
//
// A key held by another open transaction makes the INSERT wait on the
// primary key. The wait is bounded by a lock_timeout (the wait bound, or
// the time left before ctx's deadline if that is shorter) that the INSERT
// itself sets before it can wait and restores once it has inserted, so
// fn's statements keep the session's lock_timeout. ON CONFLICT DO NOTHING
// locks nothing once the holder has ended, so the waiters of a key wake up
// together instead of one after another.
//
// The store works under any isolation level ([Config.TxOptions] or the
// server's default): under REPEATABLE READ and SERIALIZABLE a caller that
// waited for a key gets a serialization failure, which the store reports as
// [idempotency.ErrConflict] and [idempotency.Guard.Do] retries; the retry
// finds the completed key. A new key reads nothing in its transaction, so
// under SERIALIZABLE it takes no predicate lock that could make callers of
// distinct keys fail.
//
// # The transaction handle
//
// The [pgx.Tx] given to fn behaves like the one [pgxpool.Pool.Begin]
// returns (Exec, Query, QueryRow, SendBatch, CopyFrom, Prepare, Begin for a
// savepoint, Conn, LargeObjects) except at its ends: [idempotency.Guard.Do]
// commits it when fn returns, so Commit called from fn returns an error and
// commits nothing, and Rollback called from fn rolls everything back and
// makes Do fail. Once Do returns, the handle is closed: its methods return
// [pgx.ErrTxClosed] (a LargeObjects value is for use inside fn only).
//
// A Reserve whose ctx is cancelled while it waits returns at once and closes
// its connection (pgx's default reaction to a cancelled query); the pool
// replaces it. The server session stops waiting only at its lock_timeout;
// configure pgconn.CancelRequestContextWatcherHandler on the pool's
// ConnConfig to cancel it at once instead.
//
// # Purge
//
// [Store.Purge] deletes the oldest expired rows, found through the
// expires_at index, in one short statement per batch, skipping rows that
// open transactions hold.
package postgres
