package sqlite

import (
	"context"
	_ "embed"
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
// idempotent.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.schema); err != nil {
		return mapError(ctx, "migrate", err)
	}
	return nil
}
