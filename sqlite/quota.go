package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency/backend"
)

var _ backend.QuotaCounter = (*Store)(nil)

// QuotaSchema returns the DDL of the quota table of the keys table named
// table: table + "_quota", one row per scope and window (see
// [backend.QuotaCounter]). [Store.Migrate] runs it; run it in your own
// migrations if you use [Schema]. A bad table name gives an error wrapping
// [idempotency.ErrInvalidConfig].
func QuotaSchema(table string) (string, error) {
	if err := validTable(table); err != nil {
		return "", err
	}
	return `-- The quota counters of github.com/go-idempotency/idempotency/sqlite.
-- span and start are nanoseconds: a window of span starting at start (Unix).
CREATE TABLE IF NOT EXISTS "` + table + `_quota" (
	scope      TEXT    NOT NULL COLLATE BINARY,
	span       INTEGER NOT NULL,
	start      INTEGER NOT NULL,
	keys       INTEGER NOT NULL,
	in_flight  INTEGER NOT NULL,
	bytes      INTEGER NOT NULL,
	checked_at INTEGER NOT NULL,
	verdict    INTEGER NOT NULL,
	PRIMARY KEY (scope, span, start)
);
`, nil
}

// quotaSchema is the DDL of the Store's quota table, which Migrate runs
// with the keys table's, in its transaction on its one connection.
func (s *Store) quotaSchema() string {
	ddl, _ := QuotaSchema(s.table) // the name was validated by New
	return ddl
}

// admitQuotaSQL counts a key in its window unless the key is completed
// and live (no row then) or a limit is reached (verdict 1, 2, 3: nothing
// counted). In the DO UPDATE, every column reads the row as it was.
//
// ?1 scope, ?2 id, ?3 span ns, ?4 ?5 ?6 the limits, ?7 test clock.
func admitQuotaSQL(table string) string {
	return `INSERT INTO "` + table + `_quota" (scope, span, start, keys, in_flight, bytes, checked_at, verdict)
SELECT ?1, ?3, c.now - ((c.now % ?3) + ?3) % ?3, 1, 1, 0, c.now, 0
FROM (SELECT ` + nowSQL(7) + ` AS now) AS c
WHERE NOT EXISTS (SELECT 1 FROM "` + table + `" AS k
	WHERE k.scope = ?1 AND k.id = ?2 AND k.state = 'completed' AND k.expires_at > c.now)
ON CONFLICT (scope, span, start) DO UPDATE SET
	verdict = CASE WHEN keys >= ?4 THEN 1 WHEN in_flight >= ?5 THEN 2 WHEN bytes >= ?6 THEN 3 ELSE 0 END,
	keys = keys + (keys < ?4 AND in_flight < ?5 AND bytes < ?6),
	in_flight = in_flight + (keys < ?4 AND in_flight < ?5 AND bytes < ?6),
	checked_at = excluded.checked_at
RETURNING start, checked_at, verdict`
}

// AdmitQuota implements [backend.QuotaCounter] in one autocommit
// statement (an UPSERT on the quota table that reads the keys table). It
// is a write: it waits for SQLite's write lock within the connection's
// busy timeout, then reports [backend.ErrConflict].
func (s *Store) AdmitQuota(ctx context.Context, q backend.QuotaCheck) (backend.QuotaAdmission, error) {
	now, err := s.testNow()
	if err != nil {
		return backend.QuotaAdmission{}, err
	}
	maxKeys, maxInFlight, maxBytes := q.Quota.Limits()
	var start, checked, verdict int64
	err = s.db.QueryRowContext(ctx, admitQuotaSQL(s.table), q.Key.Scope, q.Key.ID, int64(q.Quota.Window),
		maxKeys, maxInFlight, maxBytes, now).Scan(&start, &checked, &verdict)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return backend.QuotaAdmission{Replay: true}, nil
	case err != nil:
		return backend.QuotaAdmission{}, mapError(ctx, fmt.Sprintf("admit quota of key %v", q.Key), err)
	}
	return admission(start, checked, verdict, q.Quota.Window), nil
}

// admission builds the answer of AdmitQuota from the row: its start and
// the clock of the check in Unix nanoseconds, and its verdict.
func admission(start, checked, verdict int64, window time.Duration) backend.QuotaAdmission {
	return backend.QuotaAdmission{
		Counted:     verdict == 0,
		Over:        backend.QuotaLimit(verdict),
		WindowStart: time.Unix(0, start),
		RetryAfter:  time.Duration(start + int64(window) - checked),
	}
}

// EndQuota implements [backend.QuotaCounter] in one autocommit UPDATE.
func (s *Store) EndQuota(ctx context.Context, e backend.QuotaEnd) error {
	uncount := 1
	if e.Created {
		uncount = 0
	}
	_, err := s.db.ExecContext(ctx, `UPDATE "`+s.table+`_quota"
SET in_flight = max(in_flight - 1, 0), keys = max(keys - ?4, 0), bytes = bytes + ?5
WHERE scope = ?1 AND span = ?2 AND start = ?3`, e.Scope, int64(e.Window), e.WindowStart.UnixNano(), uncount, e.Bytes)
	if err != nil {
		return mapError(ctx, "end quota", err)
	}
	return nil
}

// PurgeQuota implements [backend.QuotaCounter]: it deletes up to limit
// rows of windows that ended by the store's clock.
func (s *Store) PurgeQuota(ctx context.Context, limit int) (int, error) {
	now, err := s.testNow()
	if err != nil {
		return 0, err
	}
	t := `"` + s.table + `_quota"`
	res, err := s.db.ExecContext(ctx, `DELETE FROM `+t+` WHERE rowid IN (SELECT rowid FROM `+t+`
WHERE start + span <= `+nowSQL(1)+` LIMIT ?2)`, now, limit)
	if err != nil {
		return 0, mapError(ctx, "purge quota", err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}
