package sqlite

import (
	"context"
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
// expiry index, for users' migrations. It is idempotent (IF NOT EXISTS). A
// bad table name gives an error wrapping [idempotency.ErrInvalidConfig].
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

// Migrate creates the Store's table and index if they do not exist. It is
// idempotent, and safe to run from several processes at once on one file.
// It runs the DDL in a transaction that takes the write lock at BEGIN
// (BEGIN IMMEDIATE). So the check "does the table exist" and the CREATE see
// the same schema. It retries SQLITE_BUSY for a while (up to 30s, while ctx
// lives), whatever the database's busy timeout.
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
		_, err := conn.ExecContext(ctx, s.schema+s.quotaSchema()) // quota.go
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
