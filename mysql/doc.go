// Package mysql is the MySQL and MariaDB [idempotency.KeyStore], on
// database/sql with github.com/go-sql-driver/mysql. The transaction handle
// fn receives is a [*sql.Tx].
//
// # Servers
//
// MySQL 8.0 or later and MariaDB 10.6 or later, InnoDB (the store uses
// FOR UPDATE NOWAIT, FOR UPDATE SKIP LOCKED, LOCK IN SHARE MODE and a
// session-level innodb_lock_wait_timeout). The store sends only SQL that
// both MySQL 8.0+ and MariaDB 10.6+ accept, the same statements to either
// (no MariaDB-only syntax, no version-dependent comments); it never asks
// which server it talks to. Tested on MariaDB 10.11.
//
// # DSN
//
// Open a pool with [Open], or check a DSN with [CheckDSN]; both refuse,
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
//   - interpolateParams=true: a statement with arguments is then one round
//     trip instead of two (prepare, execute).
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
//   - innodb_lock_wait_timeout in the DSN equal to the Guard's WaitTimeout
//     in seconds (innodb_lock_wait_timeout=30 for the default): the store
//     then leaves the session's value alone, two round trips fewer per new
//     key (not with [Config.SkipLookup], which never reads it).
//
// # How keys are held
//
// A key is a row of one table (see [Schema]; [Store.Migrate] creates it),
// under PRIMARY KEY (scope, id) of VARBINARY columns, so keys compare byte
// for byte. [Store.Reserve] inserts the key's row in the very transaction
// the effect then runs in, so the effect, the key and the stored response
// commit together or not at all:
//
//   - First the key is looked up outside any transaction (unless
//     [Config.SkipLookup]); a completed, live key is returned from that one
//     SELECT, a consistent read that never waits and also reads the
//     session's innodb_lock_wait_timeout.
//   - A new key: innodb_lock_wait_timeout is set on the session to the
//     wait bound (unless it has that value already), START TRANSACTION,
//     the INSERT of the pending row, innodb_lock_wait_timeout set back to
//     the session's value before fn runs, fn, an UPDATE storing the
//     response, COMMIT. (Neither server accepts a per-statement
//     innodb_lock_wait_timeout in SQL that the other accepts too.)
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
// # Round trips
//
// Per [idempotency.Guard.Do] with interpolateParams=true and an fn of one
// statement (a bare transaction with that statement costs 3: START
// TRANSACTION, the statement, COMMIT), on either server:
//
//	                        new key  replay
//	default (lookup first)       8       1
//	  session wait = bound       6       1
//	SkipLookup                   7       6
//
// "session wait = bound": the session's innodb_lock_wait_timeout already
// equals the wait bound in seconds (innodb_lock_wait_timeout=30 in the DSN
// for the Guard's default WaitTimeout), so the store does not set and
// restore it. The default's new key: lookup, SET, START TRANSACTION,
// INSERT, SET back, fn, UPDATE, COMMIT. [Config.SkipLookup] cannot know the
// session's value, so it always saves and sets it (one SET) and restores
// it: new key SET, START TRANSACTION, INSERT, SET back, fn, UPDATE, COMMIT;
// replay SET, START TRANSACTION, INSERT (duplicate key), locking read,
// ROLLBACK, SET back. Through a [*sql.Tx] a new key costs at least 5 (bare
// plus 2): database/sql sends START TRANSACTION and COMMIT by themselves
// and fn's statements go straight to the server, so the reservation
// (before fn) and the stored response (after it) cannot travel with
// anything and take a round trip each. The two SETs are the price of
// bounding the wait in SQL both servers accept.
//
// # Waiting
//
// InnoDB bounds lock waits by innodb_lock_wait_timeout, whole seconds, at
// least 1. The reservation's wait bound r.Wait ([idempotency.Config]'s
// WaitTimeout) is rounded up to whole seconds: a WaitTimeout of 300ms waits
// up to 1s. A wait that runs out is reported as
// [idempotency.ErrInProgress]; the same lock wait timeout (error 1205) met
// anywhere else, and deadlocks (1213), are reported as
// [idempotency.ErrConflict], which [idempotency.Guard.Do] retries.
//
// No wait (NoWait, r.Wait == 0) first probes the row with SELECT ... FOR
// UPDATE NOWAIT outside any transaction: a held key is reported at once.
// Only when another caller takes the key between that probe and the INSERT
// does the INSERT wait, for 1 second at most.
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
