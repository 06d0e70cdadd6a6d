package mysql

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency/internal/testkit"
)

// BenchmarkShapes measures, on plain connections and without the library,
// the statement sequences a new key could take on MariaDB, so that the
// cause of the store's new-key figure is a measurement rather than a
// guess. Each op is one new key with one one-row effect, in interleaved
// rounds when run by cmd/idembench -pkgs ./mysql -bench BenchmarkShapes:
//
//   - Bare: START TRANSACTION, the effect, COMMIT (the baseline).
//   - TwoWrites: the store's way (LookupNever, pool of Open): START
//     TRANSACTION with the pending INSERT, the effect, the completing UPDATE
//     with COMMIT: 3 round trips, the key row written twice.
//   - TwoWritesMoved: TwoWrites whose completing UPDATE moves expires_at
//     (as the store's does: the expiry counts from the completion), so
//     that InnoDB also rewrites the entry of expires_at_idx; TwoWrites
//     keeps the value and leaves that index alone.
//   - TwoWritesUnfolded: the same statements, each in its own round trip
//     (5): what the folding into MariaDB compound statements saves.
//   - LookupTwoWrites: a primary-key SELECT first, then TwoWrites (the store
//     with LookupAlways): one more round trip, which costs far more than a
//     round trip alone (compare Lookup).
//   - Lookup: the primary-key SELECT alone, outside any transaction.
//   - PlainSQL: the five statements of the plain SQL (START TRANSACTION,
//     INSERT IGNORE, the effect, UPDATE, COMMIT), on the store's table.
//   - LockThenRead: a lock that writes nothing (GET_LOCK) and ends with the
//     transaction's statements, the read of the key that must follow it, the
//     effect, one INSERT of the completed row with COMMIT and RELEASE_LOCK:
//     the key row written once, yet no faster than TwoWrites.
//   - LockNoRead: LockThenRead without the read: a floor no safe store can
//     reach (without the read, a key completed just before the lock would
//     run fn again).
func BenchmarkShapes(b *testing.B) {
	ctx := context.Background()
	db := openDB(b, testConfig(b, func(c *gomysql.Config) { c.InterpolateParams = true }), 0)
	f := newFixture(b, db, nil)
	table, effects := "`"+f.table+"`", "`"+f.effects+"`"
	prefix := testkit.Name("k")
	seq := 0
	newKey := func() string { seq++; return prefix + strconv.Itoa(seq) }
	now := time.Now().UnixNano()
	exp := now + int64(time.Hour)
	body := []byte(`{"tag":"bench","execution":1}`)
	header := []byte("\x01\x00\x0cContent-Type\x00\x01\x00\x10application/json")
	const cols = "(scope, id, fingerprint, state, status, header, body, created_at, expires_at)"
	pending := "INSERT INTO " + table + " " + cols + " VALUES ('s', ?, 'fp', 'pending', 0, NULL, NULL, ?, ?)"
	complete := "UPDATE " + table + " SET state = 'completed', status = 201, header = ?, body = ?, expires_at = ? WHERE scope = 's' AND id = ? AND state = 'pending'"
	completed := "INSERT INTO " + table + " " + cols + " VALUES ('s', ?, 'fp', 'completed', 201, ?, ?, ?, ?)"
	lookup := "SELECT fingerprint, state, status, header, body, created_at, expires_at FROM " + table + " WHERE scope = 's' AND id = ?"
	effect := "INSERT INTO " + effects + " (tag) VALUES ('shape')"
	lock := "SHA2(CONCAT('" + f.table + "', ?), 256)"

	shape := func(name string, op func(c *sql.Conn, key string) error) {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				c, err := db.Conn(ctx)
				if err == nil {
					err = op(c, newKey())
					_ = c.Close()
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	exec := func(c *sql.Conn, query string, args ...any) error {
		_, err := c.ExecContext(ctx, query, args...)
		return err
	}
	steps := func(c *sql.Conn, queries ...func() error) error {
		for _, q := range queries {
			if err := q(); err != nil {
				return err
			}
		}
		return nil
	}
	read := func(c *sql.Conn, key string) error {
		rows, err := c.QueryContext(ctx, lookup, key)
		if err != nil {
			return err
		}
		for rows.Next() {
		}
		_ = rows.Close()
		return rows.Err()
	}
	twoWritesTo := func(completedExp int64) func(c *sql.Conn, key string) error {
		return func(c *sql.Conn, key string) error {
			return steps(c,
				func() error {
					return exec(c, "BEGIN NOT ATOMIC START TRANSACTION; SET STATEMENT innodb_lock_wait_timeout=0 FOR "+pending+"; END", key, now, exp)
				},
				func() error { return exec(c, effect) },
				func() error {
					return exec(c, "BEGIN NOT ATOMIC "+complete+"; IF ROW_COUNT() <> 1 THEN SIGNAL SQLSTATE '45000'; END IF; COMMIT; END", header, body, completedExp, key)
				})
		}
	}
	twoWrites := twoWritesTo(exp)
	lockThen := func(check string) func(c *sql.Conn, key string) error {
		return func(c *sql.Conn, key string) error {
			return steps(c,
				func() error {
					return exec(c, "BEGIN NOT ATOMIC START TRANSACTION; IF COALESCE(GET_LOCK("+lock+", 0), 0) = 0 THEN ROLLBACK; SIGNAL SQLSTATE '45000'; END IF; "+check+" END", key, key, now)
				},
				func() error { return exec(c, effect) },
				func() error {
					return exec(c, "BEGIN NOT ATOMIC "+completed+"; COMMIT; DO RELEASE_LOCK("+lock+"); END", key, header, body, now, exp, key)
				})
		}
	}
	shape("Bare", func(c *sql.Conn, _ string) error {
		return steps(c, func() error { return exec(c, "START TRANSACTION") }, func() error { return exec(c, effect) }, func() error { return exec(c, "COMMIT") })
	})
	shape("TwoWrites", twoWrites)
	shape("TwoWritesMoved", twoWritesTo(exp+int64(time.Second)))
	shape("TwoWritesUnfolded", func(c *sql.Conn, key string) error {
		return steps(c,
			func() error { return exec(c, "START TRANSACTION") },
			func() error { return exec(c, "SET STATEMENT innodb_lock_wait_timeout=0 FOR "+pending, key, now, exp) },
			func() error { return exec(c, effect) },
			func() error { return exec(c, complete, header, body, exp, key) },
			func() error { return exec(c, "COMMIT") })
	})
	shape("LookupTwoWrites", func(c *sql.Conn, key string) error {
		if err := read(c, key); err != nil {
			return err
		}
		return twoWrites(c, key)
	})
	shape("Lookup", read)
	shape("PlainSQL", func(c *sql.Conn, key string) error {
		return steps(c,
			func() error { return exec(c, "START TRANSACTION") },
			func() error {
				return exec(c, "INSERT IGNORE INTO "+table+" "+cols+" VALUES ('s', ?, 'fp', 'pending', 0, NULL, NULL, ?, ?)", key, now, exp)
			},
			func() error { return exec(c, effect) },
			func() error { return exec(c, complete, header, body, exp, key) },
			func() error { return exec(c, "COMMIT") })
	})
	shape("LockThenRead", lockThen("IF EXISTS (SELECT 1 FROM "+table+" WHERE scope = 's' AND id = ? AND expires_at > ?) THEN ROLLBACK; SIGNAL SQLSTATE '45000'; END IF;"))
	shape("LockNoRead", func(c *sql.Conn, key string) error {
		return lockThen("DO ?; DO ?;")(c, key)
	})
}
