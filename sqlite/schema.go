package sqlite

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/sqlident"
)

// DefaultTable is the name of the keys table when [Config.Table] is empty.
const DefaultTable = "idempotency_keys"

//go:embed schema.sql
var schemaSQL string

// Schema returns the DDL that creates the keys table named table and its
// indexes, for users' migrations. It is idempotent (IF NOT EXISTS). A bad
// table name gives an error wrapping [idempotency.ErrInvalidConfig].
//
// Upgrading a table created by v0.1.0: the table gained four columns for
// multi-step operations (progress, owner, lease_ends, tries) and two
// partial indexes. [Store.Migrate] adds what is missing. By hand, run these
// once before the DDL above (with your table's name; SQLite has no ADD
// COLUMN IF NOT EXISTS, so run each ALTER only if the column is missing),
// in one BEGIN IMMEDIATE transaction:
//
//	ALTER TABLE "idempotency_keys" ADD COLUMN progress BLOB;
//	ALTER TABLE "idempotency_keys" ADD COLUMN owner TEXT;
//	ALTER TABLE "idempotency_keys" ADD COLUMN lease_ends INTEGER;
//	ALTER TABLE "idempotency_keys" ADD COLUMN tries INTEGER NOT NULL DEFAULT 0;
//	CREATE INDEX IF NOT EXISTS "idempotency_keys_lease_ends" ON "idempotency_keys" (lease_ends) WHERE progress IS NOT NULL;
//	CREATE INDEX IF NOT EXISTS "idempotency_keys_unfinished" ON "idempotency_keys" (scope, id) WHERE progress IS NOT NULL;
//
// Each ALTER only changes the schema: existing rows are not rewritten. Until
// the table is upgraded, [Store.Reserve], its Complete and [Store.Purge]
// (what Do and Guard.Purge use) keep working on it; Acquire, Abandoned,
// Inspect, Forget, List and Stats need the new columns.
func Schema(table string) (string, error) {
	if err := validTable(table); err != nil {
		return "", err
	}
	return strings.ReplaceAll(schemaSQL, DefaultTable, table), nil
}

// validTable checks a table name: 1 to 63 ASCII letters, digits and
// underscores, not starting with a digit nor with "sqlite_".
func validTable(name string) error {
	if err := sqlident.Check(name, 63); err != nil {
		return fmt.Errorf("%w: sqlite: table name %q %w", idempotency.ErrInvalidConfig, name, err)
	}
	if strings.HasPrefix(strings.ToLower(name), "sqlite_") {
		return fmt.Errorf("%w: sqlite: table name %q starts with sqlite_, which SQLite reserves", idempotency.ErrInvalidConfig, name)
	}
	return nil
}

// Schema returns the DDL of the Store's table: see the package-level
// [Schema].
func (s *Store) Schema() string { return s.schema }

// Migrate creates the Store's table and indexes if they do not exist, and
// upgrades a table created by v0.1.0: it adds the columns of multi-step
// operations that are missing (see [Schema]), then runs the DDL of
// [Store.Schema]. It is idempotent, and safe to run from several processes
// at once on one file. It runs in one transaction that takes the write
// lock at BEGIN (BEGIN IMMEDIATE). So the check "which columns exist" and
// the ALTER and CREATE statements see the same schema. It retries
// SQLITE_BUSY for a while (up to 30s, while ctx lives), whatever the
// database's busy timeout.
func (s *Store) Migrate(ctx context.Context) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return mapError(ctx, "migrate: connection", err)
	}
	defer conn.Close()
	err = retryBusy(ctx, func() error {
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			return err
		}
		err := s.upgrade(ctx, conn)
		if err == nil {
			_, err = conn.ExecContext(ctx, s.schema+s.quotaSchema()) // quota.go
		}
		if err == nil {
			_, err = conn.ExecContext(ctx, "COMMIT")
		}
		if err != nil {
			if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil && !strings.Contains(rerr.Error(), "no transaction is active") {
				discard(conn)
				return errors.Join(err, rerr)
			}
		}
		return err
	})
	if err != nil {
		return mapError(ctx, "migrate", err)
	}
	return nil
}

// stepColumns are the columns of multi-step operations that v0.1.0's table
// lacks, with their definitions for ALTER TABLE ... ADD COLUMN.
var stepColumns = [...]struct{ name, def string }{
	{"progress", "progress BLOB"},
	{"owner", "owner TEXT"},
	{"lease_ends", "lease_ends INTEGER"},
	{"tries", "tries INTEGER NOT NULL DEFAULT 0"},
}

// upgrade adds the columns of multi-step operations that the Store's
// table, if it exists, lacks. conn is in Migrate's transaction.
func (s *Store) upgrade(ctx context.Context, conn *sql.Conn) error {
	rows, err := conn.QueryContext(ctx, "SELECT name FROM pragma_table_info(?1)", s.table)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			_ = rows.Close()
			return err
		}
		have[name] = true
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	if len(have) == 0 {
		return nil // no table yet: the DDL creates it whole
	}
	for _, c := range stepColumns {
		if !have[c.name] {
			if _, err := conn.ExecContext(ctx, `ALTER TABLE "`+s.table+`" ADD COLUMN `+c.def); err != nil {
				return err
			}
		}
	}
	return nil
}
