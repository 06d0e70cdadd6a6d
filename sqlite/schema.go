package sqlite

import (
	"context"
	_ "embed"
	"fmt"
	"strings"

	"github.com/go-idempotency/idempotency"
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
	bad := func(why string) error {
		return fmt.Errorf("%w: sqlite: table name %q %s", idempotency.ErrInvalidConfig, name, why)
	}
	switch {
	case name == "":
		return bad("is empty")
	case len(name) > 63:
		return bad("is longer than 63 bytes")
	case name[0] >= '0' && name[0] <= '9':
		return bad("starts with a digit")
	case strings.HasPrefix(strings.ToLower(name), "sqlite_"):
		return bad("starts with sqlite_, which SQLite reserves")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return bad("has a character other than ASCII letters, digits and _")
		}
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
