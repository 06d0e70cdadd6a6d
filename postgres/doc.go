// Package postgres is the PostgreSQL [idempotency.KeyStore], on pgx/v5 and
// a *pgxpool.Pool. The transaction handle fn receives is a [pgx.Tx].
//
// A key is a row of one table (see [Schema]; [Store.Migrate] creates it).
// [Store.Reserve] inserts the key's row in the very transaction the effect
// then runs in, so the effect, the key and the stored response commit
// together or not at all:
//
//   - A replay of a completed key is one plain SELECT, outside any
//     transaction (one round trip).
//   - A new key is reserved by an INSERT ... ON CONFLICT sent in the same
//     round trip as BEGIN; an expired row is taken over by the same
//     statement. The response is stored by an UPDATE sent in the same round
//     trip as COMMIT.
//   - A key held by another open transaction makes the INSERT wait on the
//     primary key. The wait is bounded by a lock_timeout (the wait bound, or
//     the time left before ctx's deadline if that is shorter) that applies
//     to that one statement only: the setting in force before it is restored
//     right after it, so fn's statements keep the session's lock_timeout.
//
// The store works under any isolation level ([Config.TxOptions] or the
// server's default): under REPEATABLE READ and SERIALIZABLE a caller that
// waited for a key gets a serialization failure, which the store reports as
// [idempotency.ErrConflict] and [idempotency.Guard.Do] retries; the retry
// finds the completed key.
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
package postgres
