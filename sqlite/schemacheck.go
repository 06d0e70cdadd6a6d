package sqlite

import (
	"context"
	"fmt"
	"strings"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

var _ backend.SchemaChecker = (*Store)(nil)

// keyColumns are the columns of the keys table that this version's
// statements name (see schema.sql); quotaColumns those of the quota table
// (see [QuotaSchema]).
var (
	keyColumns = []string{"scope", "id", "fingerprint", "state", "status", "header", "body",
		"created_at", "expires_at", "progress", "owner", "lease_ends", "tries"}
	quotaColumns = []string{"scope", "span", "start", "keys", "in_flight", "bytes", "checked_at", "verdict"}
)

// CheckSchema implements [backend.SchemaChecker]: it reads the keys
// table's columns (pragma table_info) in the database the Store's pool
// opens, and with c.Quota the quota table's. A table or a column that is
// missing gives an error wrapping [idempotency.ErrSchema] naming the table
// and what is missing: run [Store.Migrate], or apply [Schema] (and
// [QuotaSchema]).
//
// Keys must compare byte for byte, as [Schema]'s BINARY collation makes
// them: a table made by other migrations whose unique index on (scope,
// id) compares by another collation (NOCASE, RTRIM) would take keys that
// differ only in case or trailing spaces for one key, so one client could
// replay another's answer. Such a table gives an error wrapping
// [idempotency.ErrSchema] too.
func (s *Store) CheckSchema(ctx context.Context, c backend.SchemaCheck) error {
	if err := s.checkColumns(ctx, s.table, keyColumns, "Schema"); err != nil {
		return err
	}
	if err := s.checkKeyCollation(ctx); err != nil {
		return err
	}
	if !c.Quota {
		return nil
	}
	return s.checkColumns(ctx, s.table+"_quota", quotaColumns, "QuotaSchema")
}

// checkColumns checks that table has the columns want; ddl names the
// function whose DDL creates it.
func (s *Store) checkColumns(ctx context.Context, table string, want []string, ddl string) error {
	rows, err := s.db.QueryContext(ctx, `SELECT name FROM pragma_table_info(?)`, table)
	if err != nil {
		return mapError(ctx, "check the schema of "+table, err)
	}
	defer func() { _ = rows.Close() }()
	var have []string
	for rows.Next() {
		var col string
		if err := rows.Scan(&col); err != nil {
			return mapError(ctx, "check the schema of "+table, err)
		}
		have = append(have, col)
	}
	if err := rows.Err(); err != nil {
		return mapError(ctx, "check the schema of "+table, err)
	}
	hint := fmt.Sprintf("run Store.Migrate, or apply sqlite.%s(%q) in your migrations", ddl, s.table)
	if len(have) == 0 {
		return fmt.Errorf("%w: sqlite: table %s does not exist in this database file: %s", idempotency.ErrSchema, table, hint)
	}
	if missing := backend.MissingColumns(have, want); len(missing) > 0 {
		return fmt.Errorf("%w: sqlite: table %s lacks the column(s) %s of this version: %s",
			idempotency.ErrSchema, table, strings.Join(missing, ", "), hint)
	}
	return nil
}

// keyCollationSQL lists the collation of each key column of each unique
// index of the table ?1 (the primary key's included) whose key columns are
// scope and id: the indexes that decide whether two keys are one.
const keyCollationSQL = `SELECT l.name, x.name, x.coll FROM pragma_index_list(?1) AS l, pragma_index_xinfo(l.name) AS x
WHERE l."unique" AND x.key AND (SELECT count(*) FROM pragma_index_xinfo(l.name) AS y WHERE y.key) = 2
  AND (SELECT count(*) FROM pragma_index_xinfo(l.name) AS y WHERE y.key AND y.name IN ('scope', 'id')) = 2`

// checkKeyCollation checks that the unique indexes on (scope, id) of the
// keys table compare by BINARY.
func (s *Store) checkKeyCollation(ctx context.Context) error {
	rows, err := s.db.QueryContext(ctx, keyCollationSQL, s.table)
	if err != nil {
		return mapError(ctx, "check the schema of "+s.table, err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var index, col, coll string
		if err := rows.Scan(&index, &col, &coll); err != nil {
			return mapError(ctx, "check the schema of "+s.table, err)
		}
		if !strings.EqualFold(coll, "BINARY") {
			return fmt.Errorf("%w: sqlite: table %s: its unique index %s compares %s by COLLATE %s, not BINARY: keys that differ "+
				"only in case or trailing spaces would be one key (one client could replay another's answer): "+
				"recreate the table as sqlite.Schema(%q) makes it (scope and id TEXT COLLATE BINARY)",
				idempotency.ErrSchema, s.table, index, col, coll, s.table)
		}
	}
	if err := rows.Err(); err != nil {
		return mapError(ctx, "check the schema of "+s.table, err)
	}
	return nil
}
