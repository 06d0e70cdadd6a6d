package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

var _ backend.SchemaChecker = (*Store)(nil)

// keyColumns are the columns of the keys table that this version's
// statements name (see schemaSQL); quotaColumns those of the quota table
// (see quotaSchemaSQL).
var (
	keyColumns = []string{"scope", "id", "fingerprint", "state", "status", "header", "body",
		"created_at", "expires_at", "progress", "owner", "lease_ends", "tries"}
	quotaColumns = []string{"scope", "span", "window_start", "n_keys", "n_in_flight", "n_bytes", "checked_at", "verdict"}
)

// columnsSQL lists the columns of the table $1 (quoted, resolved by the
// search_path as the store's statements resolve it); no row when the table
// does not exist. has_table_privilege is not asked: a missing grant shows
// up as the server's own error on the first statement.
const columnsSQL = `SELECT a.attname::text FROM pg_catalog.pg_attribute a
	WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`

// CheckSchema implements [backend.SchemaChecker]: it reads the
// catalog, through the pool, for the keys table (resolved by the
// connection's search_path, as the store's statements are) and its
// columns, and with c.Quota for the quota table. A table or a column that
// is missing gives an error wrapping [idempotency.ErrSchema] naming the
// table and what is missing: run [Store.Migrate], or apply [Schema] (and
// [QuotaSchema]).
//
// Keys must compare byte for byte, as [Schema]'s text columns do: a table
// made by other migrations whose scope or id is citext, character(n) or
// under a nondeterministic collation would take keys that differ only in
// case (or trailing spaces) for one key, so one client could replay
// another's answer. Such a table gives an error wrapping
// [idempotency.ErrSchema] too.
func (s *Store) CheckSchema(ctx context.Context, c backend.SchemaCheck) error {
	if err := s.checkColumns(ctx, s.quoted, s.table, keyColumns, "Schema"); err != nil {
		return err
	}
	if err := s.checkKeyTypes(ctx); err != nil {
		return err
	}
	if !c.Quota {
		return nil
	}
	return s.checkColumns(ctx, quotaTable(s.table), strings.ReplaceAll(quotaTable(s.table), `"`, ""), quotaColumns, "QuotaSchema")
}

// checkColumns checks that the table quoted (named name in messages) has
// the columns want; ddl names the function whose DDL creates it.
func (s *Store) checkColumns(ctx context.Context, quoted, name string, want []string, ddl string) error {
	rows, err := s.q.query(ctx, columnsSQL, execMode, quoted)
	if err != nil {
		return s.mapError(ctx, fmt.Errorf("postgres: check the schema of %s: %w", name, err), false)
	}
	var have []string
	for rows.Next() {
		var col string
		if err := rows.Scan(&col); err != nil {
			rows.Close()
			return s.mapError(ctx, fmt.Errorf("postgres: check the schema of %s: %w", name, err), false)
		}
		have = append(have, col)
	}
	if err := rows.Err(); err != nil {
		return s.mapError(ctx, fmt.Errorf("postgres: check the schema of %s: %w", name, err), false)
	}
	if len(have) == 0 {
		return fmt.Errorf("%w: postgres: table %s does not exist (in the connection's search_path): %s",
			idempotency.ErrSchema, name, migrateHint(s.table, ddl))
	}
	if missing := backend.MissingColumns(have, want); len(missing) > 0 {
		return fmt.Errorf("%w: postgres: table %s lacks the column(s) %s of this version: %s",
			idempotency.ErrSchema, name, strings.Join(missing, ", "), migrateHint(s.table, ddl))
	}
	return nil
}

// migrateHint says how to create or upgrade the tables of the keys table
// named table; ddl is the function whose DDL the hint names.
func migrateHint(table, ddl string) string {
	return fmt.Sprintf("run Store.Migrate, or apply postgres.%s(%q) in your migrations", ddl, table)
}

// keyTypesSQL gives the type (a domain's base type) of the key columns of
// the table $1, and whether their collation is deterministic (true
// before PostgreSQL 12, which has no other kind).
const keyTypesSQL = `SELECT a.attname::text, format_type(COALESCE(NULLIF(t.typbasetype, 0), a.atttypid), NULL),
	COALESCE((to_jsonb(c) ->> 'collisdeterministic')::boolean, true)
	FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
	LEFT JOIN pg_catalog.pg_collation c ON c.oid = a.attcollation
	WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped AND a.attname IN ('scope', 'id')`

// checkKeyTypes checks that scope and id compare byte for byte: text or
// character varying under a deterministic collation.
func (s *Store) checkKeyTypes(ctx context.Context) error {
	rows, err := s.q.query(ctx, keyTypesSQL, execMode, s.quoted)
	if err != nil {
		return s.mapError(ctx, fmt.Errorf("postgres: check the schema of %s: %w", s.table, err), false)
	}
	defer rows.Close()
	for rows.Next() {
		var col, typ string
		var deterministic bool
		if err := rows.Scan(&col, &typ, &deterministic); err != nil {
			return s.mapError(ctx, fmt.Errorf("postgres: check the schema of %s: %w", s.table, err), false)
		}
		why := ""
		switch {
		case typ != "text" && typ != "character varying":
			why = "is " + typ + ", not text"
		case !deterministic:
			why = "has a nondeterministic collation"
		default:
			continue
		}
		return fmt.Errorf("%w: postgres: table %s: column %s %s: keys that differ only in case or trailing spaces could be one key "+
			"(one client could replay another's answer): make it text COLLATE \"C\", as postgres.Schema(%q) does",
			idempotency.ErrSchema, s.table, col, why, s.table)
	}
	if err := rows.Err(); err != nil {
		return s.mapError(ctx, fmt.Errorf("postgres: check the schema of %s: %w", s.table, err), false)
	}
	return nil
}
