// Package sqlite is the SQLite backend of [idempotency]: a
// [idempotency.KeyStore] whose transaction type is *sql.Tx, built on
// database/sql and the pure-Go driver modernc.org/sqlite (driver name
// "sqlite").
//
// It is the embedded default: [Open] opens a database file with WAL journal
// mode, a busy timeout, foreign keys on and immediate transactions; [New]
// builds a [Store] on it (or on any *sql.DB opened with the "sqlite"
// driver), and [Store.Migrate] creates the keys table.
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
// A replay of a completed key is one SELECT outside any transaction.
//
// # Storage
//
// Times are INTEGER unix nanoseconds; the header is the JSON of the
// http.Header in a BLOB (a nil header replays as nil, an empty one as
// empty); the body is a BLOB replayed byte-exact, and a nil body (NULL)
// replays as nil while an empty non-nil body replays as an empty non-nil
// slice. Keys are TEXT compared byte by byte (BINARY collation).
package sqlite
