package mysql

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/go-idempotency/idempotency/backend"
)

var _ backend.QuotaCounter = (*Store)(nil)

// quotaName names the quota table of the keys table named table: table +
// "_quota", cut and made unique by a hash past 64 bytes.
func quotaName(table string) string {
	const suffix = "_quota"
	if len(table)+len(suffix) <= 64 {
		return table + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(table))
	tail := fmt.Sprintf("_%08x_quota", h.Sum32())
	return table[:64-len(tail)] + tail
}

// QuotaSchema returns the DDL of the quota table of the keys table named
// table: table + "_quota", one row per scope and window (see
// [backend.QuotaCounter]). [Store.Migrate] runs it; run it in your own
// migrations if you use [Schema]. A bad table name gives an error wrapping
// [idempotency.ErrInvalidConfig].
func QuotaSchema(table string) (string, error) {
	if err := checkTable(table); err != nil {
		return "", err
	}
	return "CREATE TABLE IF NOT EXISTS `" + quotaName(table) + "` (\n" +
		"  scope        VARBINARY(255) NOT NULL,\n" +
		"  span         BIGINT NOT NULL COMMENT 'window length, ms',\n" +
		"  window_start BIGINT NOT NULL COMMENT 'Unix ms',\n" +
		"  n_keys       BIGINT NOT NULL,\n" +
		"  n_in_flight  BIGINT NOT NULL,\n" +
		"  n_bytes      BIGINT NOT NULL,\n" +
		"  checked_at   BIGINT NOT NULL COMMENT 'Unix ms of the last check',\n" +
		"  verdict      BIGINT NOT NULL COMMENT 'the last check, as LAST_INSERT_ID reported it',\n" +
		"  PRIMARY KEY (scope, span, window_start)\n" +
		") ENGINE=InnoDB", nil
}

// migrateQuota creates the quota table.
func (s *Store) migrateQuota(ctx context.Context) error {
	ddl, err := QuotaSchema(s.table)
	if err != nil {
		return err
	}
	if _, err := s.db.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("mysql: migrate the quota table of %s: %w", s.table, err)
	}
	return nil
}

// The answer of the admission statement, which has no result set, comes
// back as the OK packet's last insert id, set with LAST_INSERT_ID(expr):
// the window's start in Unix seconds (windows are whole seconds, so it is
// exact) << 29 | the milliseconds left in it (at most 86400000 < 2^27) <<
// 2 | the verdict (0 counted, 1 keys, 2 in flight, 3 bytes). A key found
// completed and live inserts nothing and sets nothing: the id is 0.
const (
	quotaStartShift = 29
	quotaLeftShift  = 2
)

// admitQuotaSQL: in ON DUPLICATE KEY UPDATE, assignments run left to
// right and each sees the ones before: verdict is decided first, from the
// counts as they were, and the counts read it.
//
// Parameters: the clock, scope, span ms (x3), span ms (x2, the window's
// end), scope, id, the limits (keys, in flight, bytes).
func (s *Store) admitQuotaSQL() string {
	start := "c.ms - MOD(MOD(c.ms, ?) + ?, ?)"
	return "INSERT INTO `" + quotaName(s.table) + "` (scope, span, window_start, n_keys, n_in_flight, n_bytes, checked_at, verdict)\n" +
		"SELECT w.q_scope, w.q_span, w.q_start, 1, 1, 0, w.q_ms, LAST_INSERT_ID((w.q_start DIV 1000 << 29) | ((w.q_start + w.q_span - w.q_ms) << 2))\n" +
		"FROM (SELECT ? AS q_scope, ? AS q_span, " + start + " AS q_start, c.ms AS q_ms, c.now AS q_now FROM\n" +
		"  (SELECT t.now, FLOOR(t.now / 1000000) AS ms FROM (SELECT " + clockSQL + " AS now) AS t) AS c) AS w\n" +
		"WHERE NOT EXISTS (SELECT 1 FROM `" + s.table + "` AS k\n" +
		"  WHERE k.scope = ? AND k.id = ? AND k.state = 'completed' AND k.expires_at > w.q_now)\n" +
		"ON DUPLICATE KEY UPDATE\n" +
		"  verdict = LAST_INSERT_ID((window_start DIV 1000 << 29) | ((window_start + span - VALUES(checked_at)) << 2) |\n" +
		"    CASE WHEN n_keys >= ? THEN 1 WHEN n_in_flight >= ? THEN 2 WHEN n_bytes >= ? THEN 3 ELSE 0 END),\n" +
		"  n_keys = n_keys + IF(verdict & 3 = 0, 1, 0),\n" +
		"  n_in_flight = n_in_flight + IF(verdict & 3 = 0, 1, 0),\n" +
		"  checked_at = VALUES(checked_at)"
}

// AdmitQuota implements [backend.QuotaCounter] in one autocommit
// statement: an INSERT ... SELECT ... ON DUPLICATE KEY UPDATE on the quota
// table that reads the keys table, and reports through LAST_INSERT_ID
// (MySQL has no RETURNING).
func (s *Store) AdmitQuota(ctx context.Context, q backend.QuotaCheck) (backend.QuotaAdmission, error) {
	now, err := s.testNow()
	if err != nil {
		return backend.QuotaAdmission{}, err
	}
	span := q.Quota.Window.Milliseconds()
	maxKeys, maxInFlight, maxBytes := q.Quota.Limits()
	res, err := s.db.ExecContext(ctx, s.admitQuotaSQL(), q.Key.Scope, span, span, span, span, now,
		q.Key.Scope, q.Key.ID, maxKeys, maxInFlight, maxBytes)
	if err != nil {
		return backend.QuotaAdmission{}, mapError(ctx, err, false, "mysql: admit quota of key %v", q.Key)
	}
	v, err := res.LastInsertId()
	if err != nil {
		return backend.QuotaAdmission{}, fmt.Errorf("mysql: admit quota of key %v: %w", q.Key, err)
	}
	if v == 0 {
		return backend.QuotaAdmission{Replay: true}, nil
	}
	verdict := v & 3
	return backend.QuotaAdmission{
		Counted:     verdict == 0,
		Over:        backend.QuotaLimit(verdict),
		WindowStart: time.Unix(v>>quotaStartShift, 0),
		RetryAfter:  time.Duration(v>>quotaLeftShift&(1<<(quotaStartShift-quotaLeftShift)-1)) * time.Millisecond,
	}, nil
}

// EndQuota implements [backend.QuotaCounter] in one autocommit UPDATE.
func (s *Store) EndQuota(ctx context.Context, e backend.QuotaEnd) error {
	uncount := 1
	if e.Created {
		uncount = 0
	}
	_, err := s.db.ExecContext(ctx, "UPDATE `"+quotaName(s.table)+"`\n"+
		"SET n_in_flight = GREATEST(n_in_flight - 1, 0), n_keys = GREATEST(n_keys - ?, 0), n_bytes = n_bytes + ?\n"+
		"WHERE scope = ? AND span = ? AND window_start = ?",
		uncount, e.Bytes, e.Scope, e.Window.Milliseconds(), e.WindowStart.UnixMilli())
	return mapError(ctx, err, false, "mysql: end quota")
}

// PurgeQuota implements [backend.QuotaCounter]: it deletes up to limit
// rows of windows that ended by the store's clock.
func (s *Store) PurgeQuota(ctx context.Context, limit int) (int, error) {
	now, err := s.testNow()
	if err != nil {
		return 0, err
	}
	res, err := s.db.ExecContext(ctx, "DELETE FROM `"+quotaName(s.table)+"` WHERE window_start + span <= FLOOR("+clockSQL+" / 1000000) LIMIT ?", now, limit)
	if err != nil {
		return 0, mapError(ctx, err, false, "mysql: purge quota")
	}
	n, err := res.RowsAffected()
	return int(n), err
}
