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
func (s *Store) CheckSchema(ctx context.Context, c backend.SchemaCheck) error {
	if err := s.checkColumns(ctx, s.table, keyColumns, "Schema"); err != nil {
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
