// Package postgres is the PostgreSQL [idempotency.KeyStore], on pgx/v5 and
// a *pgxpool.Pool ([New], [Store]: fn receives a [pgx.Tx]) or on
// database/sql ([NewDB], [DBStore]: fn receives a *sql.Tx, with pgx's
// stdlib driver or lib/pq). Both are one implementation: the same table,
// statements, locks and guarantees; they differ in round trips only (see
// "On database/sql" below).
//
// A completed key is a row of one table (see [Schema]; [Store.Migrate]
// creates it) under a primary key on (scope, id). The row is written in the
// very transaction the effect runs in. So the effect, the key and the
// stored response commit together or not at all.
//
// # How a key is held
//
// [Store.Reserve] begins the transaction and takes a transaction-scoped
// advisory lock, which writes nothing. The lock is on a 64-bit hash of the
// table and the key (pg_advisory_xact_lock). Then it reads the key's
// row in a fresh statement, which sees every transaction committed before
// the lock was granted. A live completed row is returned as the record. No
// row (or an expired one) means the key is the caller's: fn runs. Then
// [backend.Txn.Complete] inserts the completed row (deleting the
// expired one first) in the same round trip as COMMIT.
//
// Every caller of the key takes the lock first, so no two of them hold the
// key at once. The primary key still guards it. A unique violation there
// (a row written by something that did not take the lock) fails the commit
// with [backend.ErrConflict]. The attempt is then rolled back and
// retried. Rolling back frees the key with the effect.
//
// Other code of the same database that takes advisory locks with 64-bit
// ids shares their lock space. An id that happens to match a key's only
// makes the two wait for each other.
//
// # Round trips
//
// A new key costs as many round trips as the bare effect transaction:
// BEGIN with the lock and the look-up, the effect, the key row with COMMIT.
// A replay costs the first round trip and a ROLLBACK.
//
// A replay can also be answered by a plain look-up of the key, outside any
// transaction, sent before the first round trip. A completed key then
// needs no transaction, and a new key pays one round trip more. The store
// sends the look-up while most of its recent first tries found a completed
// key. Only first tries of callers that did not wait for a held key count.
// It stops once new keys dominate again. [Config.Lookup] sends it always
// ([backend.LookupAlways]) or never ([backend.LookupNever]).
//
// See docs/performance.md for the round trips of each case.
//
// # Waiting
//
// A key held by another open transaction is reported at once with
// [idempotency.ErrInProgress] when the reservation must not wait (the
// core's first try, or a negative [idempotency.Config.WaitTimeout]).
// Otherwise Reserve waits for the lock under a lock_timeout: the wait
// bound, or the time left before ctx's deadline if that is shorter. The statement sets this
// lock_timeout before it waits and restores it once it has the lock. So
// fn's statements keep the session's own lock_timeout.
//
// The session's statement_timeout bounds the wait too. A wait cut by
// either timeout (SQLSTATE 55P03 or 57014) is reported as
// [idempotency.ErrInProgress], with the server's error in the chain. The
// same codes met by any other statement of the store wrap
// [backend.ErrConflict] and are retried. A caller whose ctx ends while
// it waits gets ctx's error, never [idempotency.ErrInProgress].
//
// A Reserve whose ctx is cancelled while it waits returns at once and
// closes its connection. This is pgx's default reaction to a cancelled
// query, which also sends the server a cancel request. The pool replaces
// the connection, and the server session stops waiting.
//
// # Store failures
//
// A connection that fails under the store (cut, ended by the server) gives
// an error with the driver's error in the chain. [idempotency.Guard.Do]
// adds [idempotency.ErrStore] to it. A statement of fn that fails because
// its connection failed is wrapped with [idempotency.ErrStore] by the
// handle itself. So fn's caller can tell it from fn's own failures:
// retrying with the same key is safe.
//
// A connection whose statement's ctx ended, or that failed, is closed at
// once: its socket is closed as soon as the store (or fn's handle) sees the
// error. On its own, pgx would close it in the background, after sending
// Terminate and waiting up to 15s for the server's end. The Terminate may
// never arrive (a reply lost on its way, a stalled path). The server's
// session, with its transaction and the key's lock, would then live that
// long. Once the socket is closed, the server ends the session as soon as
// it reads the close. It rolls the transaction back and frees the key, with
// no idle_in_transaction_session_timeout needed. A partition hides the
// close from the server: only that timeout (or TCP keepalives) ends the
// session then.
//
// # Isolation levels
//
// The store works under any isolation level ([Config.TxOptions] or the
// session's default). Under REPEATABLE READ and SERIALIZABLE the look-up
// would read a snapshot that may predate the lock. Under SERIALIZABLE its
// read would also make callers of distinct keys fail each other. So under
// those two levels the first round trip writes a pending key row instead
// of reading. It still takes the lock, and a new key costs no more round
// trips. Complete then stores the response on that row. A row committed
// since the snapshot fails with a serialization failure. The store reports
// it as [backend.ErrConflict], and [idempotency.Guard.Do] retries. The
// retry finds the completed key. When TxOptions does not name the level,
// the store starts with the read-committed way. It switches for good at
// the first transaction that reports another level.
//
// # The transaction handle
//
// The [pgx.Tx] given to fn behaves like the one [pgxpool.Pool.Begin]
// returns, except at its ends. This holds for Exec, Query, QueryRow,
// SendBatch, CopyFrom, Prepare, Begin for a savepoint, Conn and
// LargeObjects. [idempotency.Guard.Do] commits the transaction when fn
// returns. So Commit called from fn returns an error and commits nothing.
// Rollback called from fn rolls everything back and makes Do fail. The
// transaction must not be ended by SQL of fn's own (COMMIT through Exec or
// through Conn): the key would then not be held.
//
// Once Do returns, the handle is closed: its methods return
// [pgx.ErrTxClosed]. A LargeObjects value is for use inside fn only.
//
// # Behind a transaction pooler
//
// The store's own statements depend on no session state (see
// docs/deployments.md in the repository). They use no SET but
// set_config(..., true) inside a statement, and transaction-scoped
// advisory locks only. Behind a pooler (PgBouncer in transaction mode,
// PgCat, RDS Proxy) they use no named prepared statement.
//
// The store recognises a connection behind a pooler at its first
// reservation, without a round trip of its own. The server's process id
// then differs from the one the connection's start-up reported. On such a
// connection the store sends its batches as unnamed statements, whatever
// the pool's default exec mode.
//
// fn's statements use the pool's mode. Behind such a pooler, add
// default_query_exec_mode=exec to the DSN. A statement of fn that lost a
// prepared statement of pgx's cache there fails with
// [ErrStatementCacheBehindPooler] in its chain.
//
// # On database/sql
//
// [DBStore] sends the statements [Store] sends, in the same order, but
// database/sql has no pipeline: each statement is a round trip of its
// own, and BEGIN is one too (it is [sql.DB.BeginTx]). And fn can commit a
// *sql.Tx, which a [pgx.Tx] of [Store] refuses: so a DBStore always
// reserves a key with its advisory lock and a pending row, as [Store] does
// under REPEATABLE READ and SERIALIZABLE, and a transaction fn committed
// leaves the key held until the reservation's provisional expiry, never
// free for a second run. Counted with pgx's stdlib driver, a one-statement
// effect included: a new key costs 6 round trips (BEGIN, lock, pending
// row, effect, completion, COMMIT) where [Store] needs 3; a replay 5
// (BEGIN, lock, pending row, ROLLBACK, look-up) where [Store] needs 2, or
// 1 on both once the plain look-up is sent first (see Round trips above;
// a new key then costs 7). lib/pq sends each statement with parameters in
// two round trips (it prepares it first) unless the DSN says
// binary_parameters=yes. docs/performance.md has the measured figures.
//
// Errors of pgx's stdlib driver (*pgconn.PgError) and of lib/pq (*pq.Error,
// read through its Get method, so this module does not depend on lib/pq)
// are mapped to the root sentinels alike. Behind a transaction pooler, the
// store's statements travel as the driver sends them: with pgx's stdlib
// driver add default_query_exec_mode=exec to the DSN, as for fn's
// statements; with lib/pq, binary_parameters=yes (without it lib/pq sends a
// statement with parameters as two exchanges, which a pooler may route to
// two server connections).
//
// # Multi-step operations
//
// [Store] implements [backend.Stepper] on the same table: an unfinished
// operation's key is a committed row with state 'pending', its progress,
// its owner and the end of that owner's lease, its tries, and the expiry
// MaxExpiry (so Purge never deletes it). [Store.Acquire] holds the key as
// Reserve does, by its advisory lock in the phase's transaction, and reads
// the row after the lock: that lock is the compare-and-swap on the lease.
// Save, Release and Complete write the row in the same round trip as
// COMMIT. Reserve reports such a key with [idempotency.ErrInProgress].
//
// # Key administration
//
// [Store] implements [backend.KeyAdmin] and [backend.KeyLister].
// Inspect reads pg_locks, which takes no lock, to tell a key held by an
// open transaction (a new key included, which has no row yet). Forget
// takes the key's advisory lock only if it is free, so it never waits and
// never deletes a key held. List and Stats read committed rows only: a key
// is held there by a live lease.
//
// # Purge
//
// [Store.Purge] deletes the oldest expired rows, found through the
// expires_at index, in one short statement per batch. It skips rows that
// open transactions hold. Under READ COMMITTED a caller taking over an
// expired key holds it by its lock, not by the old row. Purge may delete
// that row meanwhile: the caller's completion writes the key row anew.
package postgres
