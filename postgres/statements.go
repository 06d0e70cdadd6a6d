package postgres

import (
	"fmt"
	"hash/fnv"

	"github.com/go-idempotency/idempotency"
)

// statements is the SQL of a store, built once by [New] for its quoted
// table q.
type statements struct {
	migrate string

	// tryLock takes the key's advisory lock if it is free ($1, the key's
	// lock id) and reports whether it did. It also reports the
	// transaction's isolation level and the server's process id (see
	// noteBackend).
	tryLock string
	// waitLock waits for the key's advisory lock ($1) under a lock_timeout
	// local to the statement ($2, see lockTimeout). It saves the session's
	// lock_timeout, sets the bound, waits, then restores the saved value.
	// So fn's statements run under the session's own setting. It reports
	// what tryLock does.
	waitLock string
	// lookup reads the key's row ($3 is the clock parameter, see nowFrom),
	// whether it has expired and whether it is pending: a committed pending
	// row that has not expired (an unfinished operation's) is held.
	lookup string

	// insert writes the completed key row, with the response, as the
	// transaction's last statement before COMMIT; deleteExpired first
	// removes the expired row the reservation found, if any.
	insert        string
	deleteExpired string

	// insertPending and takeOver reserve the key with a pending row (under
	// REPEATABLE READ and SERIALIZABLE, see reservationSQL); complete then
	// stores the response on that row.
	insertPending string
	takeOver      string
	complete      string

	purge string
	// purgeV1 is purge for a table of v0.1.0, which has no progress column.
	purgeV1 string

	// The statements of multi-step operations (steps.go) and of key
	// administration (admin.go).
	acquire       string
	lockRow       string
	claimNew      string
	saveNew       string
	saveExisting  string
	completeSteps string
	abandoned     string
	inspect       string
	forgetRead    string
	forget        string
	list          string
	stats         string
}

func newStatements(table, q string) statements {
	var st statements
	h := fnv.New64a()
	h.Write([]byte("idempotency/postgres " + q))
	st.migrate = fmt.Sprintf("SELECT pg_advisory_xact_lock(%d);\n%s", int64(h.Sum64()), schemaSQL(table, q))
	st.tryLock = `SELECT pg_try_advisory_xact_lock($1::int8), current_setting('transaction_isolation'), pg_backend_pid()`
	// Each OFFSET 0 keeps a subquery apart, so that its target list is
	// evaluated before the outer one: save, bound, wait, restore.
	st.waitLock = `SELECT true, current_setting('transaction_isolation'),
	set_config('lock_timeout', current_setting('idempotency.saved_lock_timeout'), true), pg_backend_pid()
FROM (SELECT pg_advisory_xact_lock($1::int8) FROM (SELECT set_config('lock_timeout', $2::text, true)
	FROM (SELECT set_config('idempotency.saved_lock_timeout', current_setting('lock_timeout'), true) OFFSET 0) saved
	OFFSET 0) bound OFFSET 0) locked`
	st.lookup = `SELECT k.fingerprint, k.status, k.header, k.body, k.created_at, k.expires_at, k.expires_at <= n.now, k.state = 'pending'
FROM ` + nowFrom(3) + `, ` + q + ` AS k
WHERE k.scope = $1 AND k.id = $2`
	// created_at: the transaction's start (the reservation's BEGIN) on the
	// server's clock; expires_at: the server's clock at completion plus
	// the TTL ($9).
	st.insert = `INSERT INTO ` + q + ` (scope, id, fingerprint, state, status, header, body, created_at, expires_at)
VALUES ($1, $2, $3, 'completed', $4, $5, $6, COALESCE($7::timestamptz, now()), ` + expirySQL(`COALESCE($8::timestamptz, clock_timestamp())`, 9) + `)`
	st.deleteExpired = `DELETE FROM ` + q + ` WHERE scope = $1 AND id = $2 AND expires_at <= COALESCE($3::timestamptz, clock_timestamp())`
	st.insertPending, st.takeOver = reservationSQL(q)
	// The key row is found by the ctid the reservation returned (stable:
	// the transaction holds the row); the other conditions only check it.
	st.complete = `UPDATE ` + q + ` SET state = 'completed', status = $4, header = $5, body = $6,
	expires_at = ` + expirySQL(`COALESCE($7::timestamptz, clock_timestamp())`, 8) + `
WHERE ctid = $1 AND scope = $2 AND id = $3 AND state = 'pending'`
	// The oldest expired rows are found through the expires_at index,
	// locked, then deleted by ctid. A scan of the table would walk over the
	// rows earlier batches deleted, which stay until VACUUM. The clock is read
	// once, in an InitPlan, so the index condition can use it.
	// An unfinished row never expires (its expires_at is MaxExpiry), and
	// purge skips it by its progress too.
	st.purgeV1 = `DELETE FROM ` + q + ` WHERE ctid = ANY (ARRAY(SELECT ctid FROM ` + q +
		` WHERE expires_at <= (SELECT COALESCE($1::timestamptz, clock_timestamp())) ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))`
	st.purge = `DELETE FROM ` + q + ` WHERE ctid = ANY (ARRAY(SELECT ctid FROM ` + q +
		` WHERE expires_at <= (SELECT COALESCE($1::timestamptz, clock_timestamp())) AND progress IS NULL ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))`
	stepStatements(&st, q)
	return st
}

// maxExpirySQL is [backend.MaxExpiry] in microseconds, rounded down.
const maxExpirySQL = `'2262-04-11 23:47:16.854775+00'::timestamptz`

// expirySQL is the expiry of a record whose clock reading is the SQL
// expression now and whose TTL is parameter $ttl. The TTL is an interval,
// sent as a time.Duration: whole microseconds. The expiry is now plus the
// TTL, clamped to [backend.MaxExpiry].
func expirySQL(now string, ttl int) string {
	return fmt.Sprintf(`LEAST(%s + $%d::interval, %s)`, now, ttl, maxExpirySQL)
}

// nowFrom is a one-row subquery "n" whose column now is the clock reading
// of a statement. That is parameter $param (a test clock's reading). When
// it is NULL, it is the server's clock_timestamp(), read once for the whole
// statement.
func nowFrom(param int) string {
	return fmt.Sprintf(`(SELECT COALESCE($%d::timestamptz, clock_timestamp()) AS now OFFSET 0) AS n`, param)
}

// reservationSQL returns the two statements that reserve a key with a
// pending row on the quoted table q: insertSQL inserts it, takeOverSQL turns
// an expired row into it. Their parameters: scope $1, id $2, fingerprint
// $3, the clock $4 (NULL: the server's, see nowFrom), the TTL $5 and the
// wait bound $6 (a lock_timeout value). The provisional expiry is the
// clock plus the TTL. Every parameter is cast, so that the simple protocol
// works too. Each returns the ctid of the row it reserved, or no row.
//
// They serve REPEATABLE READ and SERIALIZABLE transactions, whose snapshot
// may predate the advisory lock. A row committed since then makes them fail
// with a serialization failure instead of letting fn run a second time. The
// wait bound is set and restored by the statement itself, as in waitLock.
// The insert is ON CONFLICT DO NOTHING: it locks nothing once a holder has
// ended.
func reservationSQL(q string) (insertSQL, takeOverSQL string) {
	const bound = `(SELECT set_config('lock_timeout', $6::text, true)
	FROM (SELECT set_config('idempotency.saved_lock_timeout', current_setting('lock_timeout'), true) OFFSET 0) saved
	OFFSET 0) bound`
	const restore = `set_config('lock_timeout', current_setting('idempotency.saved_lock_timeout'), true)`
	insertSQL = `INSERT INTO ` + q + ` (scope, id, fingerprint, state, created_at, expires_at)
SELECT $1::text, $2::text, $3::text, 'pending', n.now, ` + expirySQL("n.now", 5) + ` FROM ` + bound + `, ` + nowFrom(4) + `
ON CONFLICT (scope, id) DO NOTHING
RETURNING ctid, ` + restore
	takeOverSQL = `UPDATE ` + q + ` AS k SET fingerprint = $3::text, state = 'pending', status = NULL, header = NULL, body = NULL,
	created_at = n.now, expires_at = ` + expirySQL("n.now", 5) + `
FROM ` + bound + `, ` + nowFrom(4) + `
WHERE k.scope = $1::text AND k.id = $2::text AND k.expires_at <= n.now
RETURNING k.ctid, ` + restore
	return insertSQL, takeOverSQL
}

// lockID is the advisory lock id of key on the quoted table q: a 64-bit
// FNV-1a hash of both. Two keys that share one (about one chance in 2^64)
// only wait for each other.
func lockID(q string, key idempotency.Key) int64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	add := func(s string) {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint64(s[i])) * prime
		}
		h *= prime // a 0 byte as separator (h ^ 0 == h): a scope holds no NUL
	}
	add(q)
	add(key.Scope)
	add(key.ID)
	return int64(h)
}
