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
// or rolls back.
//
// The writers of one Store queue in memory for its write turn, in order,
// each woken as soon as the one ahead is done. Callers of one key meet
// there too, as any two writers do: a Guard lets one of its callers of a
// key reach the Store, and the others wait for it in the Guard. Waiting for
// a key is bounded by [idempotency.Reservation.Wait] (the Guard's
// WaitTimeout) and by ctx; past the bound [Store.Reserve] returns an error
// wrapping [idempotency.ErrInProgress]. Waiting for the write turn, which
// callers of other keys hold, is never "key in progress": it lasts until
// the call's wait bound ([idempotency.Reservation.Deadline]; without one,
// r.Wait or 5s, whichever is longer), then gives [idempotency.ErrConflict]
// (a busy database; at the bound the Guard reports it with
// [idempotency.ErrStore]). A caller that does not wait (a negative
// [idempotency.Config.WaitTimeout]) does not wait for the write turn
// either: while a caller of another key holds it, Do fails at once with an
// error wrapping [idempotency.ErrStore] (the database is busy and the key
// is not held; retrying the same key later is safe), and a caller of a
// held key gets ErrInProgress at once.
//
// # Several processes on one file
//
// Writers outside the Store (another process, another Store on the same
// database, plain transactions on db) meet it at SQLite's write lock, whose
// busy handler polls on a schedule of its own. Such a writer may hold the
// very key being reserved: its reservation is a row that no other
// connection sees until it commits, so SQLite cannot tell "the other
// process holds this key" from "it writes another key" without waiting.
// The Store therefore treats the write lock held outside it as a key that
// may be held, and a caller sees what it sees for a key held in its own
// process: Do waits for the lock until the Guard's WaitTimeout, counted
// from the start of the call (the busy timeout is lowered for the
// reservation when it would overshoot, and set back before fn runs), then
// returns [idempotency.ErrInProgress], unless the key was found completed
// meanwhile; without a wait it returns ErrInProgress at once. The callers
// of other keys of the Store, queued for its write turn behind the one that
// waits for the lock, get ErrInProgress at their bound too (at once without
// a wait): what holds them up may hold their key. The guarantee
// does not depend on any of this: the key's row and fn's effects commit in
// one transaction under one write lock, so whichever process wins the key
// runs fn, and every other caller, in any process, replays its answer.
//
// A reservation made without the Guard (Reserve called directly) with
// r.Wait == 0 and no Deadline waits for that lock under the connection's
// busy timeout, then reports [idempotency.ErrConflict].
//
// [Open] and [Store.Migrate] are safe to race from several processes on a
// fresh file: switching it to WAL and creating the table can meet
// SQLITE_BUSY without the busy handler being called, and both retry it
// for up to 30s while ctx lives.
//
// A database opened without any DSN option (rollback journal, no busy
// timeout, deferred transactions) works too: the reservation is the first
// statement of the transaction, so no snapshot is read before the write
// lock is taken; and since a COMMIT outside WAL mode waits for the
// database's readers, Complete raises a busy timeout below 5s to 5s for its
// UPDATE and COMMIT, and restores it afterwards.
//
// # Statements per Do
//
// SQLite runs in the process: a statement is a function call, not a round
// trip; what costs is the fsync of each COMMIT (synchronous=FULL) and, much
// less, the CPU of each statement and the pages each commit writes to the
// WAL. With [Open]'s settings:
//
//   - a replay of a completed key: 1 statement, a prepared SELECT outside
//     any transaction on any pooled connection;
//   - a new key: 5 statements besides fn's, one fsync: the SELECT, BEGIN
//     IMMEDIATE, the INSERT of the reservation, then fn's statements, the
//     UPDATE storing the response and COMMIT;
//   - the bare effect transaction, for comparison: 2 statements besides
//     the effect's (BEGIN IMMEDIATE, COMMIT), one fsync.
//
// A reservation with a wait bound or r.NoWait also reads the connection's
// busy timeout, and sets it (and back) when the bound is shorter; so does
// a first try whose call has less of its WaitTimeout left than the busy
// timeout read when the statements were prepared (5s with Open): with a
// WaitTimeout of 5s or more, a new key costs no PRAGMA. A
// database not in WAL mode also gets the busy timeout read, and two PRAGMAs
// around the commit if it is below 5s.
//
// # Storage
//
// Times are INTEGER unix nanoseconds; the header is the JSON of the
// http.Header in a BLOB (a nil header replays as nil, an empty one as
// empty); the body is a BLOB replayed byte-exact, and a nil body (NULL)
// replays as nil while an empty non-nil body replays as an empty non-nil
// slice. Keys are TEXT compared byte by byte (BINARY collation).
package sqlite
