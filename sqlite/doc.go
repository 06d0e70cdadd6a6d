// Package sqlite is the SQLite backend of [idempotency]: a
// [idempotency.KeyStore] whose transaction type is *sql.Tx, built on
// database/sql and the pure-Go driver modernc.org/sqlite (driver name
// "sqlite").
//
// It is the embedded default: [Open] opens a database file with WAL journal
// mode, a busy timeout, foreign keys on and immediate transactions (and
// SQLite's default synchronous=FULL: see [DSNOptions]); [New] builds a
// [Store] on it (or on any *sql.DB opened with the "sqlite" driver), and
// [Store.Migrate] creates the keys table.
//
// # How keys are held
//
// A reservation is a row inserted, under the table's primary key (scope, id),
// as the first write of the transaction the caller's effect then runs in:
// the effect, the key and the stored response commit together or not at all.
// SQLite runs one write transaction at a time for the whole database, so a
// caller that holds a key holds the database's write lock until it commits
// or rolls back. Waiting for a key another caller holds is waiting for that
// lock, bounded by [idempotency.Reservation.Wait] (the Guard's WaitTimeout)
// and by ctx; past the bound [Store.Reserve] returns an error wrapping
// [idempotency.ErrInProgress]. SQLite cannot tell which key the writer holds,
// so a caller of another key waits, and is refused the same way, too (see
// conformance.Features.SerialWriters). With [idempotency.Config.NoWait] any
// caller that finds the write lock taken gets ErrInProgress at once.
//
// Within one Store these waits happen in memory, in order, and end as soon
// as the holder is done: callers of the same key wait for the caller ahead
// of them and receive the record it committed (or found); writers of other
// keys queue for the Store's write turn. Only writers outside the Store
// meet at SQLite's lock, whose busy handler polls (1ms growing to 100ms
// between tries): under load that alone made tail latencies of 100ms.
//
// # Statements per Do
//
// SQLite runs in the process: a statement is a function call, not a round
// trip; what costs is the fsync of each COMMIT (synchronous=FULL) and, much
// less, the CPU of each statement and the pages each commit writes to the
// WAL. With [Open]'s settings:
//
//   - a replay of a completed key: 1 statement, a prepared SELECT outside
//     any transaction on any pooled connection (callers of that key
//     waiting in the same Store: none, the record is handed over);
//   - a new key: 6 statements besides fn's, one fsync: the SELECT, a read
//     of the connection's busy_timeout (database/sql may hand out any
//     connection; the wait for the write lock must stay within the bound),
//     BEGIN IMMEDIATE, the INSERT of the reservation, then fn's statements,
//     the UPDATE storing the response and COMMIT. The commit writes about
//     4.5 pages to the WAL where the effect alone writes 1 (the keys table,
//     its primary key and expiry indexes);
//   - the bare effect transaction, for comparison: 2 statements besides
//     the effect's (BEGIN IMMEDIATE, COMMIT), one fsync.
//
// The busy timeout is changed (and set back before fn runs) only when the
// wait bound left is shorter than it: with NoWait, with a WaitTimeout
// below the DSN's 5s, or on a connection without busy timeout. A database
// not in WAL mode also gets two PRAGMAs around the commit if its busy
// timeout is below 5s.
//
// # Storage
//
// Times are INTEGER unix nanoseconds; the header is the JSON of the
// http.Header in a BLOB (a nil header replays as nil, an empty one as
// empty); the body is a BLOB replayed byte-exact, and a nil body (NULL)
// replays as nil while an empty non-nil body replays as an empty non-nil
// slice. Keys are TEXT compared byte by byte (BINARY collation).
package sqlite
