package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/go-idempotency/idempotency/backend"
	"github.com/jackc/pgx/v5"
)

var _ backend.QuotaCounter = (*Store)(nil)

// quotaName names the quota table of the keys table named name
// (unqualified): name + "_quota", cut and made unique by a hash past 63
// bytes, as indexName does.
func quotaName(name string) string {
	const suffix = "_quota"
	if len(name)+len(suffix) <= maxIdentLen {
		return name + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	tail := fmt.Sprintf("_%08x_quota", h.Sum32())
	return name[:maxIdentLen-len(tail)] + tail
}

// QuotaSchema returns the DDL of the quota table of the keys table named
// table (see [Config.Table]): table + "_quota" in the same schema, one row
// per scope and window (see [backend.QuotaCounter]). [Store.Migrate]
// runs it; run it in your own migrations if you use [Schema]. A bad table
// name gives an error wrapping [idempotency.ErrInvalidConfig].
func QuotaSchema(table string) (string, error) {
	if _, err := quoteTable(table); err != nil {
		return "", err
	}
	return quotaSchemaSQL(quotaTable(table)), nil
}

// quotaTable returns the quoted quota table of table (validated).
func quotaTable(table string) string {
	for i := len(table) - 1; i >= 0; i-- {
		if table[i] == '.' {
			return `"` + table[:i] + `"."` + quotaName(table[i+1:]) + `"`
		}
	}
	return `"` + quotaName(table) + `"`
}

// quotaSchemaSQL: span and window_start are Unix milliseconds, as is
// checked_at, the store's clock at the last check.
func quotaSchemaSQL(q string) string {
	return `CREATE TABLE IF NOT EXISTS ` + q + ` (
	scope        TEXT COLLATE "C" NOT NULL,
	span         BIGINT NOT NULL,
	window_start BIGINT NOT NULL,
	n_keys       BIGINT NOT NULL,
	n_in_flight  BIGINT NOT NULL,
	n_bytes      BIGINT NOT NULL,
	checked_at   BIGINT NOT NULL,
	verdict      INTEGER NOT NULL,
	PRIMARY KEY (scope, span, window_start)
);
`
}

// migrateQuota creates the quota table under the lock of Migrate.
func (s *Store) migrateQuota(ctx context.Context) error {
	h := fnv.New64a()
	h.Write([]byte("idempotency/postgres " + s.quoted))
	ddl := fmt.Sprintf("SELECT pg_advisory_xact_lock(%d);\n%s", int64(h.Sum64()), quotaSchemaSQL(quotaTable(s.table)))
	if _, err := s.q.exec(ctx, ddl); err != nil {
		return fmt.Errorf("postgres: migrate the quota table of %s: %w", s.table, err)
	}
	return nil
}

// admitQuotaSQL counts a key in its window unless the key is completed
// and live (no row then) or a limit is reached (verdict 1, 2, 3: nothing
// counted). The DO UPDATE reads the row as it was, locked: concurrent
// checks of one window queue on it.
//
// $1 scope, $2 id, $3 span ms, $4 $5 $6 the limits, $7 the clock.
func (s *Store) admitQuotaSQL() string {
	return `INSERT INTO ` + quotaTable(s.table) + ` AS q (scope, span, window_start, n_keys, n_in_flight, n_bytes, checked_at, verdict)
SELECT $1::text, $3::int8, c.ms - mod(mod(c.ms, $3::int8) + $3::int8, $3::int8), 1, 1, 0, c.ms, 0
FROM (SELECT n.now, floor(extract(epoch FROM n.now) * 1000)::int8 AS ms FROM ` + nowFrom(7) + `) AS c
WHERE NOT EXISTS (SELECT 1 FROM ` + s.quoted + ` AS k
	WHERE k.scope = $1::text AND k.id = $2::text AND k.state = 'completed' AND k.expires_at > c.now)
ON CONFLICT (scope, span, window_start) DO UPDATE SET
	verdict = CASE WHEN q.n_keys >= $4::int8 THEN 1 WHEN q.n_in_flight >= $5::int8 THEN 2 WHEN q.n_bytes >= $6::int8 THEN 3 ELSE 0 END,
	n_keys = q.n_keys + CASE WHEN q.n_keys < $4::int8 AND q.n_in_flight < $5::int8 AND q.n_bytes < $6::int8 THEN 1 ELSE 0 END,
	n_in_flight = q.n_in_flight + CASE WHEN q.n_keys < $4::int8 AND q.n_in_flight < $5::int8 AND q.n_bytes < $6::int8 THEN 1 ELSE 0 END,
	checked_at = EXCLUDED.checked_at
RETURNING window_start, checked_at, verdict`
}

// AdmitQuota implements [backend.QuotaCounter] in one autocommit
// statement on the pool: an upsert on the quota table that reads the keys
// table.
func (s *Store) AdmitQuota(ctx context.Context, q backend.QuotaCheck) (backend.QuotaAdmission, error) {
	now, err := s.now()
	if err != nil {
		return backend.QuotaAdmission{}, err
	}
	maxKeys, maxInFlight, maxBytes := q.Quota.Limits()
	var start, checked int64
	var verdict int
	err = s.q.queryRow(ctx, s.admitQuotaSQL(), q.Key.Scope, q.Key.ID, q.Quota.Window.Milliseconds(),
		maxKeys, maxInFlight, maxBytes, now).Scan(&start, &checked, &verdict)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return backend.QuotaAdmission{Replay: true}, nil
	case err != nil:
		return backend.QuotaAdmission{}, fmt.Errorf("postgres: admit quota of key %v: %w", q.Key, s.mapError(ctx, err, false))
	}
	return backend.QuotaAdmission{
		Counted:     verdict == 0,
		Over:        backend.QuotaLimit(verdict),
		WindowStart: time.UnixMilli(start),
		RetryAfter:  time.Duration(start+q.Quota.Window.Milliseconds()-checked) * time.Millisecond,
	}, nil
}

// EndQuota implements [backend.QuotaCounter] in one autocommit UPDATE.
func (s *Store) EndQuota(ctx context.Context, e backend.QuotaEnd) error {
	uncount := 1
	if e.Created {
		uncount = 0
	}
	_, err := s.q.exec(ctx, `UPDATE `+quotaTable(s.table)+`
SET n_in_flight = greatest(n_in_flight - 1, 0), n_keys = greatest(n_keys - $4::int8, 0), n_bytes = n_bytes + $5::int8
WHERE scope = $1::text AND span = $2::int8 AND window_start = $3::int8`,
		e.Scope, e.Window.Milliseconds(), e.WindowStart.UnixMilli(), uncount, e.Bytes)
	if err != nil {
		return fmt.Errorf("postgres: end quota: %w", s.mapError(ctx, err, false))
	}
	return nil
}

// PurgeQuota implements [backend.QuotaCounter]: it deletes up to limit
// rows of windows that ended by the store's clock. Rows locked by a check
// are skipped, not waited for.
func (s *Store) PurgeQuota(ctx context.Context, limit int) (int, error) {
	now, err := s.now()
	if err != nil {
		return 0, err
	}
	t := quotaTable(s.table)
	tag, err := s.q.exec(ctx, `DELETE FROM `+t+` WHERE ctid IN (SELECT ctid FROM `+t+`, `+nowFrom(1)+`
WHERE window_start + span <= floor(extract(epoch FROM n.now) * 1000)::int8 LIMIT $2::int8 FOR UPDATE SKIP LOCKED)`, now, limit)
	if err != nil {
		return 0, fmt.Errorf("postgres: purge quota: %w", s.mapError(ctx, err, false))
	}
	return int(tag.RowsAffected()), nil
}
