// Package mysql is the MySQL and MariaDB [idempotency.KeyStore], on
// database/sql with github.com/go-sql-driver/mysql. The transaction handle
// fn receives is a [*sql.Tx].
//
// # Servers
//
// MySQL 8.0 or later and MariaDB 10.6 or later (Galera clusters included),
// InnoDB. The store asks the server's version once per [Store] (SELECT
// VERSION(), on its first reservation) because the two servers bound a
// lock wait differently:
//
//   - MariaDB bounds the one statement that may wait for a key: SET
//     STATEMENT innodb_lock_wait_timeout=N FOR INSERT ..., where N = 0
//     refuses to wait at all. The session is never changed.
//   - MySQL has no per-statement innodb_lock_wait_timeout (its optimizer
//     hint SET_VAR does not take it) and no value below 1 second, so the
//     store sets the session's value to the wait bound around the
//     reservation and restores it before fn runs; a reservation that must
//     not wait first probes the key with SELECT ... FOR UPDATE NOWAIT. This
//     costs more round trips per new key (see Round trips).
//
// On MariaDB the store also folds START TRANSACTION and COMMIT into its
// own statements (see Round trips). Every other statement is the same on
// both. Tested on MariaDB 10.11, where the tests also run the MySQL path.
//
// # DSN
//
// Open a pool with [Open], or parse a DSN with [ParseDSN]; both take the
// driver's form and the mysql:// URL form, and both refuse,
// with [idempotency.ErrInvalidConfig], what breaks the store: a DSN without
// a database name, autocommit=0, and a READ-UNCOMMITTED
// transaction_isolation or tx_isolation. [New] takes any *sql.DB and cannot
// see its DSN, and the server's own defaults must not break the store
// either: sessions must start with autocommit on and at READ COMMITTED or
// stronger (the MySQL defaults). Nothing else matters to the store: times
// are stored as BIGINT Unix nanoseconds, so parseTime, loc and the server's
// time zone are irrelevant; no decision depends on clientFoundRows (the
// row counts the store checks are the same with and without it); charset
// and collation do not matter, since keys and responses are sent and
// stored as binary. Recommended:
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
//     WaitTimeout in seconds (innodb_lock_wait_timeout=30 for the default):
//     a caller that waits for a held key then needs no SET.
//
// # How keys are held
//
// A key is a row of one table (see [Schema]; [Store.Migrate] creates it),
// under PRIMARY KEY (scope, id) of VARBINARY columns, so keys compare byte
// for byte. [Store.Reserve] inserts the key's row in the very transaction
// the effect then runs in, so the effect, the key and the stored response
// commit together or not at all:
//
//   - First the key may be looked up outside any transaction; a completed,
//     live key is returned from that one primary-key SELECT, a consistent
//     read that never waits. On MariaDB the store does so while most of its
//     recent first tries found a completed key, and for a caller that
//     waited for a held key; [idempotency.LookupAlways] always,
//     [idempotency.LookupNever] never (see [Config.Lookup]). On MySQL it
//     always does, unless [idempotency.LookupNever].
//   - A new key: START TRANSACTION, the INSERT of the pending row (bounded
//     by the wait bound), fn, an UPDATE storing the response, COMMIT (on
//     MariaDB, in two statements: see Round trips).
//   - An expired row is taken over by an UPDATE guarded by expires_at <=
//     now, in the transaction fn uses (no INSERT ... ON DUPLICATE KEY
//     UPDATE: telling its takeover from its no-op would depend on
//     clientFoundRows, and it would lock live rows exclusively).
//   - A key held by another open transaction makes the INSERT (or the
//     takeover) wait on the primary key. When the holder commits, the
//     INSERT fails with a duplicate key and leaves a shared lock on the
//     committed row, which a locking read (LOCK IN SHARE MODE) then returns
//     whatever the isolation level; the transaction is rolled back.
//
// The key row is written twice (the pending INSERT, the completing UPDATE)
// because the key must be held by something before fn runs, and InnoDB has
// no lock on an absent key that writes nothing and excludes others: gap
// locks are shared (two callers would both run fn, one then deadlocking),
// and GET_LOCK is a session lock that outlives COMMIT (one more round trip
// to release it) and is not supported on Galera clusters.
//
// # Round trips
//
// Per [idempotency.Guard.Do] with interpolateParams=true, not counting fn's
// own statements (a bare transaction with one statement costs 3: START
// TRANSACTION, the statement, COMMIT). [idempotency.Guard.Do] first
// reserves without waiting and, when the key is held elsewhere, again with
// its wait bound: "waiter" is a caller that finds a key held by another
// process and gets its record.
//
//	                                     new key  replay  waiter
//	MariaDB, pool of Open, LookupAlways        3       1       9
//	MariaDB, pool of Open, LookupNever         2       3       7
//	MariaDB, other pools, LookupAlways         5       1      11
//	MariaDB, other pools, LookupNever          4       4       9
//	MySQL                                      8       1  10 (8)
//	MySQL, LookupNever                         7       7       8
//
// MariaDB's default follows the load: while new keys dominate, a new key
// costs what it costs with LookupNever (2 round trips on a pool of Open)
// and a replay 3; while replays dominate, a replay costs 1 and a new key 3.
// Four first tries of the other kind in a row switch the way (see
// TestRoundTripsFollowTheLoad). Measured on MariaDB 10.11 here, the look-up
// costs a new key about 110-140 µs, far more than the round trip alone
// (about 30 µs): a SELECT before the write transaction slows the
// transaction itself.
//
// On MariaDB, with a pool of [Open] (which interpolates arguments), the
// store sends START TRANSACTION inside its INSERT and COMMIT inside its
// UPDATE, each pair as one compound statement (BEGIN NOT ATOMIC ... END),
// and database/sql's own BEGIN and COMMIT of that transaction send
// nothing: a new key is the lookup, START TRANSACTION with the INSERT, fn,
// the UPDATE with COMMIT. The UPDATE's compound commits only if it changed
// the pending row (else it raises an error and the transaction is rolled
// back), exactly as the plain path checks the UPDATE's row count before
// its COMMIT. A response too large to interpolate (over the DSN's
// maxAllowedPacket) is stored by a prepared UPDATE and a COMMIT of its
// own. On other pools (a *sql.DB that [Open] did not make) START
// TRANSACTION and COMMIT go alone; the rest is the same.
//
// With [idempotency.LookupNever] a new key saves the lookup, and a replay is
// START TRANSACTION with the INSERT (duplicate key), a locking read and
// ROLLBACK.
//
// MySQL new key: lookup (which also reads the session's
// innodb_lock_wait_timeout), probe, SET, START TRANSACTION, INSERT, SET
// back, UPDATE, COMMIT; a waiter saves the two SETs of its second try when
// the session's value equals the wait bound (the figure in parentheses).
// MySQL has no compound statements outside stored programs, so nothing is
// folded there.
//
// # Waiting
//
// InnoDB bounds lock waits by innodb_lock_wait_timeout, whole seconds. The
// reservation's wait bound r.Wait ([idempotency.Config]'s WaitTimeout) is
// rounded up to whole seconds, at least 1: a WaitTimeout of 300ms waits up
// to 1s. A wait that runs out is reported as [idempotency.ErrInProgress];
// the same lock wait timeout (error 1205) met anywhere else, and deadlocks
// (1213), are reported as [idempotency.ErrConflict], which
// [idempotency.Guard.Do] retries.
//
// No wait (r.Wait == 0): on MariaDB the INSERT itself refuses to wait
// (innodb_lock_wait_timeout=0 for that statement). InnoDB also makes an
// INSERT wait for locks near the key rather than on it (a purge deleting
// the rows next to it, a locking read of an absent key that took the
// gap), so a refused INSERT is followed by a probe of the row (SELECT ...
// FOR UPDATE NOWAIT, outside any transaction): only a row held elsewhere
// is reported as [idempotency.ErrInProgress]; a refusal by a lock near the
// key is a conflict that [idempotency.Guard.Do] retries after a short
// backoff. (Without the probe, a purge made new keys wait as if held: in
// BenchmarkScale's purge of 1M keys, 29 of them.) On MySQL the row is
// first probed with SELECT ... FOR UPDATE NOWAIT outside any transaction:
// a held key is reported at once; only when another caller takes the key
// between that probe and the INSERT does the INSERT wait, for 1 second at
// most.
//
// When the holder of a key rolls back while several callers wait for it
// in their INSERT, InnoDB grants the row to one of them and answers most
// others with a deadlock: they retry as [idempotency.ErrConflict] and find
// the key held or completed. Exactly one effect commits and no caller but
// the failing one sees an error.
//
// A Reserve whose ctx ends while it waits returns ctx's error at once: the
// driver closes the connection (the pool opens another when needed). The
// server thread notices only when its lock wait ends, within the wait
// bound; it then rolls back.
//
// # Isolation
//
// The store works under READ COMMITTED, REPEATABLE READ (the default) and
// SERIALIZABLE: the session's level, or [Config.Isolation]. Its own reads
// inside the transaction are locking reads, which see the latest committed
// rows under any level.
//
// # Purge
//
// [Store.Purge] locks expired rows with SELECT ... FOR UPDATE SKIP LOCKED
// in a READ COMMITTED transaction and deletes exactly those, 250 per
// DELETE, each found by one unique lookup of its primary key (the keys are
// a derived table joined first, STRAIGHT_JOIN, to the table FORCE INDEX
// (PRIMARY)): rows held by open transactions are skipped, never waited
// for. A batch of n rows costs 3 + n/250 round trips.
package mysql
