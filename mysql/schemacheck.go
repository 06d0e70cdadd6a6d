package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

var _ backend.SchemaChecker = (*Store)(nil)

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

// CheckSchema implements [backend.SchemaChecker]: it reads the columns
// of the keys table of the DSN's database (an empty SELECT), and with
// c.Quota those of the quota table. A table or a column that is missing,
// or a DSN without a database, gives an error wrapping
// [idempotency.ErrSchema] naming the table and what is missing: run
// [Store.Migrate], or apply [Schema] (and [QuotaSchema]).
//
// The key columns scope and id must be VARBINARY, as [Schema] makes
// them: a table made by other migrations with VARCHAR columns compares
// keys by its collation (MySQL's default utf8mb4_0900_ai_ci ignores case
// and accents), so scopes "Acme" and "acme" would be one key space and one
// client could replay another's answer. Such a table gives an error
// wrapping [idempotency.ErrSchema] too.
func (s *Store) CheckSchema(ctx context.Context, c backend.SchemaCheck) error {
	types, err := s.checkColumns(ctx, s.table, keyColumns(), "Schema")
	if err != nil {
		return err
	}
	if err := s.checkKeyTypes(types); err != nil {
		return err
	}
	if !c.Quota {
		return nil
	}
	_, err = s.checkColumns(ctx, quotaName(s.table), quotaColumns, "QuotaSchema")
	return err
}

// checkColumns checks that table has the columns want, and returns the
// table's columns; ddl names the function whose DDL creates it. It reads
// the columns of an empty result of the table, not information_schema
// (whose temporary tables a busy MariaDB may fail to clean up, failing the
// check for no reason of the schema's).
func (s *Store) checkColumns(ctx context.Context, table string, want []string, ddl string) ([]*sql.ColumnType, error) {
	hint := fmt.Sprintf("run Store.Migrate, or apply mysql.%s(%q) in your migrations", ddl, s.table)
	rows, err := s.db.QueryContext(ctx, "SELECT * FROM `"+table+"` LIMIT 0")
	var me *gomysql.MySQLError
	switch {
	case errors.As(err, &me) && me.Number == erNoSuchTable && ctx.Err() == nil:
		return nil, fmt.Errorf("%w: mysql: table %s does not exist in the DSN's database (%s): %s", idempotency.ErrSchema, table, me.Message, hint)
	case errors.As(err, &me) && me.Number == erNoDB && ctx.Err() == nil:
		return nil, fmt.Errorf("%w: mysql: table %s: the DSN names no database (%s): %s", idempotency.ErrSchema, table, me.Message, hint)
	case err != nil:
		return nil, mapError(ctx, err, false, "mysql: check the schema of %s", table)
	}
	types, err := rows.ColumnTypes()
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, mapError(ctx, err, false, "mysql: check the schema of %s", table)
	}
	cols := make([]string, len(types))
	for i, ct := range types {
		cols[i] = ct.Name()
	}
	if missing := backend.MissingColumns(cols, want); len(missing) > 0 {
		return nil, fmt.Errorf("%w: mysql: table %s lacks the column(s) %s of this version: %s",
			idempotency.ErrSchema, table, strings.Join(missing, ", "), hint)
	}
	return types, nil
}

// checkKeyTypes checks that the keys table's columns scope and id, among
// types, compare byte for byte: VARBINARY.
func (s *Store) checkKeyTypes(types []*sql.ColumnType) error {
	for _, ct := range types {
		if name := strings.ToLower(ct.Name()); (name == "scope" || name == "id") && ct.DatabaseTypeName() != "VARBINARY" {
			return fmt.Errorf("%w: mysql: table %s: column %s is %s, not VARBINARY: keys would compare by its collation, so keys that differ "+
				"only in case, accents or trailing spaces would be one key (one client could replay another's answer): "+
				"ALTER TABLE `%s` MODIFY %s VARBINARY(255) NOT NULL, as mysql.Schema(%q) makes it",
				idempotency.ErrSchema, s.table, name, ct.DatabaseTypeName(), s.table, name, s.table)
		}
	}
	return nil
}
