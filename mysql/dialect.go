package mysql

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"time"
)

// dialect is how a server lets the store bound the lock wait of its
// reservation. Both accept every other statement the store sends.
type dialect int32

const (
	dialectUnknown dialect = iota
	// dialectMariaDB: the wait bound travels with each statement that may
	// wait (SET STATEMENT innodb_lock_wait_timeout=N FOR ...), and N = 0
	// refuses to wait at all.
	dialectMariaDB
	// dialectMySQL: MySQL has no per-statement innodb_lock_wait_timeout (nor
	// a value of 0), so the bound is set on the session and restored.
	dialectMySQL
)

// maxLockWait is the largest innodb_lock_wait_timeout, in seconds.
const maxLockWait = 1073741824

// dialectOf returns the dialect of s's server, asking it on conn (SELECT
// VERSION(), one round trip) the first time only.
func (s *Store) dialectOf(ctx context.Context, conn *sql.Conn) (dialect, error) {
	if d := dialect(s.dialect.Load()); d != dialectUnknown {
		return d, nil
	}
	var version string
	if err := conn.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return dialectUnknown, err
	}
	d := dialectMySQL
	if strings.Contains(strings.ToLower(version), "mariadb") {
		d = dialectMariaDB
	}
	s.dialect.CompareAndSwap(int32(dialectUnknown), int32(d))
	return d, nil
}

// lockWaitSeconds maps a wait bound to innodb_lock_wait_timeout: whole
// seconds, rounded up, at least 1 (MySQL's minimum), at most its maximum.
func lockWaitSeconds(wait time.Duration) int64 {
	s := int64(wait / time.Second)
	if wait%time.Second != 0 {
		s++
	}
	return min(max(s, 1), maxLockWait)
}

// statementWait returns the MariaDB prefix that bounds the lock waits of
// the statement it precedes by wait: 0 (no wait at all) for a zero wait,
// else lockWaitSeconds(wait).
func statementWait(wait time.Duration) string {
	n := int64(0)
	if wait > 0 {
		n = lockWaitSeconds(wait)
	}
	return "SET STATEMENT innodb_lock_wait_timeout=" + strconv.FormatInt(n, 10) + " FOR "
}

func setLockWaitSQL(seconds int64) string {
	return "SET SESSION innodb_lock_wait_timeout = " + strconv.FormatInt(seconds, 10)
}

// saveAndSetLockWaitSQL saves the session's innodb_lock_wait_timeout in a
// user variable and sets it to seconds. restoreSavedLockWaitSQL restores it
// and clears the variable. Each is right whether the server evaluates the
// values of a SET one by one or all before assigning any.
func saveAndSetLockWaitSQL(seconds int64) string {
	return "SET @idempotency_lock_wait = @@SESSION.innodb_lock_wait_timeout, SESSION innodb_lock_wait_timeout = " + strconv.FormatInt(seconds, 10)
}

const restoreSavedLockWaitSQL = "SET SESSION innodb_lock_wait_timeout = @idempotency_lock_wait, @idempotency_lock_wait = NULL"
