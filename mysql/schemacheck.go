package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/go-idempotency/idempotency"
)

var _ idempotency.SchemaChecker = (*Store)(nil)

// quotaColumns are the columns of the quota table (see [QuotaSchema]).
var quotaColumns = []string{"scope", "span", "window_start", "n_keys", "n_in_flight", "n_bytes", "checked_at", "verdict"}

// keyColumns returns the columns of the keys table that this version's
// statements name (see [Schema]).
func keyColumns() []string {
	cols := []string{"scope", "id", "fingerprint", "state", "status", "header", "body", "created_at", "expires_at"}
	for _, c := range stepColumns {
		cols = append(cols, c[0])
	}
	return cols
}

// columnsSQL lists the columns of the table ? in the connection's
// database, as the store's statements resolve it: one row with a NULL
// column when the table does not exist.
const columnsSQL = `SELECT COALESCE(DATABASE(), ''), LOWER(c.COLUMN_NAME)
FROM (SELECT 1 AS one) d LEFT JOIN information_schema.COLUMNS c
ON c.TABLE_SCHEMA = DATABASE() AND c.TABLE_NAME = ?`

// CheckSchema implements [idempotency.SchemaChecker]: it reads
// information_schema for the keys table of the DSN's database and its
// columns, and with c.Quota for the quota table. A table or a column that
// is missing gives an error wrapping [idempotency.ErrSchema] naming the
// table and what is missing: run [Store.Migrate], or apply [Schema] (and
// [QuotaSchema]).
func (s *Store) CheckSchema(ctx context.Context, c idempotency.SchemaCheck) error {
	if err := s.checkColumns(ctx, s.table, keyColumns(), "Schema"); err != nil {
		return err
	}
	if !c.Quota {
		return nil
	}
	return s.checkColumns(ctx, quotaName(s.table), quotaColumns, "QuotaSchema")
}

// checkColumns checks that table has the columns want; ddl names the
// function whose DDL creates it.
func (s *Store) checkColumns(ctx context.Context, table string, want []string, ddl string) error {
	rows, err := s.db.QueryContext(ctx, columnsSQL, table)
	if err != nil {
		return mapError(ctx, err, false, "mysql: check the schema of %s", table)
	}
	defer func() { _ = rows.Close() }()
	var db string
	var have []string
	for rows.Next() {
		var col sql.NullString
		if err := rows.Scan(&db, &col); err != nil {
			return mapError(ctx, err, false, "mysql: check the schema of %s", table)
		}
		if col.Valid {
			have = append(have, col.String)
		}
	}
	if err := rows.Err(); err != nil {
		return mapError(ctx, err, false, "mysql: check the schema of %s", table)
	}
	hint := fmt.Sprintf("run Store.Migrate, or apply mysql.%s(%q) in your migrations", ddl, s.table)
	if len(have) == 0 {
		if db == "" {
			return fmt.Errorf("%w: mysql: table %s does not exist: the DSN names no database: %s", idempotency.ErrSchema, table, hint)
		}
		return fmt.Errorf("%w: mysql: table %s does not exist in database %s: %s", idempotency.ErrSchema, table, db, hint)
	}
	var missing []string
	for _, col := range want {
		if !slices.Contains(have, col) {
			missing = append(missing, col)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: mysql: table %s of database %s lacks the column(s) %s of this version: %s",
			idempotency.ErrSchema, table, db, strings.Join(missing, ", "), hint)
	}
	return nil
}
