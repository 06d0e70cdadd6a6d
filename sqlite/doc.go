// Package sqlite is the SQLite backend of [idempotency]. Its [Store] is an
// [idempotency.KeyStore] whose transaction type is *sql.Tx. It is built on
// database/sql and the pure-Go driver modernc.org/sqlite (driver name
// "sqlite").
//
// It is the embedded default. [Open] opens a database file with WAL journal
// mode, a busy timeout, foreign keys on and immediate transactions. It keeps
// SQLite's default synchronous=FULL (see [DSNOptions]). [New] builds a
// [Store] on it, or on any *sql.DB opened with the "sqlite" driver.
// [Store.Migrate] creates the keys table.
//
// # How keys are held
//
// A reservation is a row inserted under the table's primary key (scope, id).
// It is the first write of the transaction that the caller's effect then
// runs in. The effect, the key and the stored response commit together or
// not at all. SQLite runs one write transaction at a time for the whole
// database. So a caller that holds a key holds the database's write lock
// until it commits or rolls back.
//
// The writers of one Store queue in memory for its write turn, in order.
// Each is woken as soon as the one ahead is done. Callers of one key meet
// there too, as any two writers do. A Guard lets one of its callers of a
// key reach the Store; the others wait for it in the Guard.
//
// Waiting for a key is bounded by [backend.Reservation.Wait] (the
// Guard's WaitTimeout) and by ctx. Past the bound, [Store.Reserve] returns
// an error wrapping [idempotency.ErrInProgress].
//
// Waiting for the write turn, which callers of other keys hold, is never
// "key in progress". It lasts until the call's wait bound
// ([backend.Reservation.Deadline]; without one, r.Wait or 5s, whichever
// is longer). Then it gives [backend.ErrConflict]: a busy database. At
// the bound the Guard reports it with [idempotency.ErrStore].
//
// A caller that does not wait (a negative [idempotency.Config.WaitTimeout])
// does not wait for the write turn either. While a caller of another key
// holds it, Do fails at once with an error wrapping [idempotency.ErrStore].
// The database is busy and the key is not held, so retrying the same key
// later is safe. A caller of a held key gets ErrInProgress at once.
//
// # Several processes on one file
//
// Writers outside the Store meet it at SQLite's write lock: another
// process, another Store on the same database, plain transactions on db.
// That lock's busy handler polls on a schedule of its own. Such a writer may
// hold the very key being reserved. Its reservation is a row that no other
// connection sees until it commits. So SQLite cannot tell "the other process
// holds this key" from "it writes another key" without waiting.
//
// The Store therefore treats the write lock held outside it as a key that
// may be held. A caller sees what it sees for a key held in its own process.
// Do waits for the lock until the Guard's WaitTimeout, counted from the
// start of the call. The busy timeout is lowered for the reservation when it
// would overshoot, and set back before fn runs. Then Do returns
// [idempotency.ErrInProgress], unless the key was found completed meanwhile.
// Without a wait it returns ErrInProgress at once.
//
// The callers of other keys of the Store queue for its write turn behind
// the one that waits for the lock. They get ErrInProgress at their bound too
// (at once without a wait): what holds them up may hold their key.
//
// The guarantee does not depend on any of this. The key's row and fn's
// effects commit in one transaction under one write lock. So whichever
// process wins the key runs fn, and every other caller, in any process,
// replays its answer.
//
// A reservation made without the Guard (Reserve called directly) may have
// r.Wait == 0 and no Deadline. It waits for that lock under the
// connection's busy timeout, then reports [backend.ErrConflict].
//
// [Open] and [Store.Migrate] are safe to race from several processes on a
// fresh file. Switching it to WAL and creating the table can meet
// SQLITE_BUSY without the busy handler being called. Both retry it for up
// to 30s while ctx lives.
//
// A database opened without any DSN option works too (rollback journal, no
// busy timeout, deferred transactions). The reservation is the first
// statement of the transaction, so no snapshot is read before the write
// lock is taken. A COMMIT outside WAL mode waits for the database's readers.
// So Complete raises a busy timeout below 5s to 5s for its UPDATE and
// COMMIT, and restores it afterwards.
//
// # Multi-step operations and key administration
//
// The Store implements [backend.Stepper], [backend.KeyAdmin] and
// [backend.KeyLister] on the same table, with four more columns:
// progress (NOT NULL on an unfinished operation), owner and lease_ends (the
// run that holds it, and until when by the store's clock) and tries.
// [Store.Migrate] adds them to a table created by v0.1.0 ([Schema] shows
// the statements). Do, Reserve and Purge keep working on a v0.1.0 table
// until it is upgraded.
//
// A phase ([Store.Acquire]) is a write transaction like a reservation: it
// holds SQLite's write lock, for the whole database, from Acquire until
// Save, Release, Complete or Rollback. Acquire waits for it, and reports
// a key it may not take, exactly as Reserve does. An unfinished key is a
// committed pending row whose expiry is [backend.MaxExpiry]: Reserve
// reports it with [idempotency.ErrInProgress] and never takes it over,
// and Purge never deletes it.
//
// Inspect, List, Stats and Abandoned are one SELECT each, outside any
// transaction: in WAL mode they wait for no writer. They see committed
// rows only, and of the keys held in open transactions they can tell only
// those of this Store (see [Store.Inspect]). Forget takes the write lock
// for one DELETE. It refuses a held key at once, and waits for the writers
// of other keys for at most a second (see [Store.Forget]).
//
// # Statements per Do
//
// SQLite runs in the process: a statement is a function call, not a round
// trip. A replay of a completed key is one SELECT outside any transaction.
// A new key adds a reservation and a stored response to fn's transaction.
// See docs/performance.md for the statements and PRAGMAs each case costs.
//
// # Storage
//
// Times are INTEGER unix nanoseconds. The header is the JSON of the
// http.Header in a BLOB: a nil header replays as nil, an empty one as empty.
// The body is a BLOB replayed byte-exact. A nil body (NULL) replays as nil,
// while an empty non-nil body replays as an empty non-nil slice. Keys are
// TEXT compared byte by byte (BINARY collation).
package sqlite
