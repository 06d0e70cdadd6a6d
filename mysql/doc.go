// Package mysql is the MySQL and MariaDB [idempotency.KeyStore], on
// database/sql with github.com/go-sql-driver/mysql. The transaction handle
// fn receives is a [*sql.Tx].
//
// # Servers
//
// The store runs on MySQL 8.0 or later and MariaDB 10.6 or later (Galera
// clusters included), on InnoDB. The two servers bound a lock wait
// differently. So the store asks the server's version once per [Store]
// (SELECT VERSION(), on its first reservation).
//
//   - MariaDB bounds the one statement that may wait for a key: SET
//     STATEMENT innodb_lock_wait_timeout=N FOR INSERT ..., and N = 0
//     refuses to wait at all. The session is never changed.
//   - MySQL has no per-statement innodb_lock_wait_timeout (its optimizer
//     hint SET_VAR does not take it) and no value below 1 second. So the
//     store sets the session's value to the wait bound around the
//     reservation and restores it before fn runs. A reservation that must
//     not wait first probes the key with SELECT ... FOR UPDATE NOWAIT. This
//     costs more round trips per new key (see docs/performance.md).
//
// On MariaDB the store also folds START TRANSACTION and COMMIT into its
// own statements (see Round trips). Every other statement is the same on
// both. Tested on MariaDB 10.11, where the tests also run the MySQL path.
//
// # DSN
//
// Open a pool with [Open], or parse a DSN with [ParseDSN]. Both take the
// driver's form and the mysql:// URL form. Both refuse what breaks the
// store, with [idempotency.ErrInvalidConfig]: a DSN without a database
// name, autocommit=0, and a READ-UNCOMMITTED transaction_isolation or
// tx_isolation.
//
// [New] takes any *sql.DB and cannot see its DSN. The server's own
// defaults must not break the store either: sessions must start with
// autocommit on and at READ COMMITTED or stronger (the MySQL defaults).
//
// Nothing else matters to the store. Times are stored as BIGINT Unix
// nanoseconds, so parseTime, loc and the server's time zone are
// irrelevant. No decision depends on clientFoundRows: the row counts the
// store checks are the same with and without it. Charset and collation do
// not matter, since keys and responses are sent and stored as binary.
//
// Recommended:
//
//   - interpolateParams=true, which [Open] turns on unless the DSN says
//     otherwise: a statement with arguments is then one round trip instead
//     of two (prepare, execute).
//   - db.SetMaxIdleConns about as large as the number of concurrent callers:
//     database/sql keeps 2 idle connections by default, and a caller that
//     finds none dials and authenticates a new one.
//   - readTimeout, if set, longer than the Guard's WaitTimeout: a waiting
//     reservation is a statement that reads nothing until the key is
//     released.
//   - max_allowed_packet (server, and the driver's maxAllowedPacket) larger
//     than the biggest stored response: header and body are LONGBLOB and
//     travel in one statement. The server defaults (16 MiB on MariaDB,
//     64 MiB on MySQL) hold responses of several MiB.
//   - On MySQL, innodb_lock_wait_timeout in the DSN equal to the Guard's
//     WaitTimeout in seconds (30 for the default). A caller that waits for
//     a held key then needs no SET.
//
// # How keys are held
//
// A key is a row of one table (see [Schema]; [Store.Migrate] creates it),
// under PRIMARY KEY (scope, id) of VARBINARY columns, so keys compare byte
// for byte. [Store.Reserve] inserts the key's row in the very transaction
// the effect then runs in. So the effect, the key and the stored response
// commit together or not at all:
//
//   - First the key may be looked up outside any transaction. A completed,
//     live key is returned from that one primary-key SELECT, a consistent
//     read that never waits. On MariaDB the store does so while more than
//     about a third of its recent first tries found a completed key, and
//     for a caller that waited for a held key. [backend.LookupAlways]
//     looks up always, [backend.LookupNever] never (see [Config.Lookup]).
//     On MySQL the store always does, unless [backend.LookupNever].
//   - A new key: START TRANSACTION, the INSERT of the pending row (bounded
//     by the wait bound), fn, an UPDATE storing the response, COMMIT. On
//     MariaDB the store's four statements travel as two (see Round trips).
//   - An expired row is taken over by an UPDATE guarded by expires_at <=
//     now, in the transaction fn uses. The store does not use INSERT ... ON
//     DUPLICATE KEY UPDATE there: telling its takeover from its no-op would
//     depend on clientFoundRows, and it would lock live rows exclusively.
//   - A key held by another open transaction makes the INSERT (or the
//     takeover) wait on the primary key. When the holder commits, the
//     INSERT fails with a duplicate key and leaves a shared lock on the
//     committed row. A locking read (LOCK IN SHARE MODE) then returns that
//     row whatever the isolation level, and the transaction is rolled back.
//
// The key row is written twice (the pending INSERT, the completing UPDATE)
// because the key must be held by something before fn runs. InnoDB has no
// lock on an absent key that writes nothing and excludes others. Gap locks
// are shared: two callers would both run fn, one then deadlocking.
// GET_LOCK is a session lock that outlives COMMIT, so releasing it costs
// one more round trip. Galera clusters do not support it.
//
// # Round trips
//
// On MariaDB, with a pool of [Open] (which interpolates arguments), the
// store sends START TRANSACTION inside its INSERT and COMMIT inside its
// UPDATE. Each pair is one compound statement (BEGIN NOT ATOMIC ... END).
// The transaction's own BEGIN and COMMIT in database/sql then send
// nothing. A new key is the lookup, START TRANSACTION with the INSERT, fn,
// and the UPDATE with COMMIT.
//
// The UPDATE's compound commits only if it changed the pending row; else
// it raises an error and the transaction is rolled back. The plain path
// checks the UPDATE's row count before its COMMIT in exactly the same way.
// A response too large to interpolate (over the DSN's maxAllowedPacket) is
// stored by a prepared UPDATE and a COMMIT of its own. On other pools (a
// *sql.DB that [Open] did not make) START TRANSACTION and COMMIT go alone;
// the rest is the same.
//
// With [backend.LookupNever] a new key saves the lookup. A replay is
// then START TRANSACTION with the INSERT (duplicate key), a locking read
// and ROLLBACK.
//
// MariaDB's default follows the load. While replays are more than about a
// third of recent first tries, it looks keys up first, and a replay is the
// lookup alone. Otherwise it skips the lookup, as with
// [backend.LookupNever]. Four new keys in a row switch the lookup off,
// five replays in a row on again (see TestRoundTripsFollowTheLoad). A
// lookup wasted on a new key costs one round trip (and a SELECT before
// the write transaction slows the transaction itself, by far more than
// its round trip); a replay without it costs two round trips and a row
// lock more, and about twice the CPU of a wasted lookup: near a third the
// two ways cost the same.
//
// On MySQL a new key is the lookup (which also reads the session's
// innodb_lock_wait_timeout), the probe, SET, START TRANSACTION, INSERT,
// SET back, UPDATE and COMMIT. A waiter saves the two SETs of its second
// try when the session's value equals the wait bound. MySQL has no
// compound statements outside stored programs, so nothing is folded
// there.
//
// See docs/performance.md for the round trips of each case and what the
// lookup costs.
//
// # Waiting
//
// InnoDB bounds lock waits by innodb_lock_wait_timeout, in whole seconds.
// The reservation's wait bound r.Wait ([idempotency.Config.WaitTimeout])
// is rounded up to whole seconds, at least 1: a WaitTimeout of 300ms waits
// up to 1s. A wait that runs out is reported as
// [idempotency.ErrInProgress]. The same lock wait timeout (error 1205) met
// anywhere else, and deadlocks (1213), are reported as
// [backend.ErrConflict], which [idempotency.Guard.Do] retries.
//
// No wait (r.Wait == 0): on MariaDB the INSERT itself refuses to wait
// (innodb_lock_wait_timeout=0 for that statement). InnoDB also makes an
// INSERT wait for locks near the key rather than on it. A purge deleting
// the rows next to it takes such locks, and so does a locking read of an
// absent key that took the gap. So a refused INSERT is followed by a probe
// of the row, outside any transaction (SELECT ... FOR UPDATE NOWAIT). Only
// a row held elsewhere is reported as [idempotency.ErrInProgress]. A
// refusal by a lock near the key is a conflict that [idempotency.Guard.Do]
// retries after a short backoff when the caller does not wait (a negative
// WaitTimeout). For a caller that waits, any conflict of the first try (a
// lock near the key, a deadlock; on Galera, a certification failure of a
// key another node has just reserved) is reported as
// [idempotency.ErrInProgress], the key possibly held, with the conflict
// kept in the chain: the caller then makes its waiting try, which waits
// for the holder within its bound or finds the key free, or, with no
// waiter slot left ([idempotency.Config].MaxWaiters), retries it as a
// conflict.
//
// On MySQL the row is first probed with SELECT ... FOR UPDATE NOWAIT,
// outside any transaction, and a held key is reported at once. Only when
// another caller takes the key between that probe and the INSERT does the
// INSERT wait, for 1 second at most.
//
// When the holder of a key rolls back while several callers wait for it
// in their INSERT, InnoDB grants the row to one of them. It answers most
// others with a deadlock: they retry as [backend.ErrConflict] and find
// the key held or completed. Exactly one effect commits, and no caller but
// the failing one sees an error.
//
// A Reserve whose ctx ends while it waits returns ctx's error at once. The
// driver closes the connection, and the pool opens another when needed.
// The server thread notices only when its lock wait ends, within the wait
// bound. It then rolls back.
//
// # Isolation
//
// The store works under READ COMMITTED, REPEATABLE READ (the default) and
// SERIALIZABLE: the session's level, or [Config.Isolation]. Its own reads
// inside the transaction are locking reads. They see the latest committed
// rows under any level.
//
// # Purge
//
// [Store.Purge] locks expired rows with SELECT ... FOR UPDATE SKIP LOCKED
// in a READ COMMITTED transaction, and deletes exactly those. Rows held by
// open transactions are skipped, never waited for. Each DELETE removes up
// to 250 rows. Each row is found by one unique lookup of its primary key:
// the keys are a derived table joined first (STRAIGHT_JOIN) to the table
// FORCE INDEX (PRIMARY). It skips the rows of unfinished operations
// (progress not NULL), which never expire anyway.
//
// # Multi-step operations and administration
//
// [Store] implements [backend.Stepper], [backend.KeyAdmin] and
// [backend.KeyLister] on the same table, with four more columns
// (progress, owner, lease_ends, tries; see [Schema] to upgrade a v0.1.0
// table). An unfinished operation's row stays pending with expires_at at
// [backend.MaxExpiry], so Reserve reports it in progress and Purge
// never deletes it. [Store.Acquire] locks an existing row with SELECT ...
// FOR UPDATE before judging its lease (only the lock's holder decides,
// and no gap is locked), and inserts a new key's row as Reserve does.
// [Store.Forget] refuses a held key with FOR UPDATE NOWAIT;
// [Store.Inspect] tells an open transaction's hold with a shared NOWAIT
// probe. On a Galera cluster these probes see the transactions of their
// own node only; the statements rely on row locks, never on gap locks.
package mysql
