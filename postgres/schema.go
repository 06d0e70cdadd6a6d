package postgres

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/sqlident"
)

// DefaultTable is the table [New] uses when [Config.Table] is empty.
const DefaultTable = "idempotency_keys"

// maxIdentLen is PostgreSQL's longest identifier (NAMEDATALEN - 1).
const maxIdentLen = 63

// Schema returns the DDL of the keys table named table (see [Config.Table]),
// for users' migrations: CREATE TABLE IF NOT EXISTS and CREATE INDEX IF NOT
// EXISTS, safe to run again.
func Schema(table string) (string, error) {
	q, err := quoteTable(table)
	if err != nil {
		return "", err
	}
	return schemaSQL(table, q), nil
}

// Schema returns the DDL of s's table; see the package-level [Schema].
func (s *Store) Schema() string { return s.schema }

// Migrate creates s's table and its index if they do not exist. It is
// idempotent and safe to run from several processes at once.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, s.sql.migrate); err != nil {
		return fmt.Errorf("postgres: migrate %s: %w", s.table, err)
	}
	return s.migrateQuota(ctx)
}

// quoteTable validates a table name and returns it quoted.
func quoteTable(table string) (string, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("%w: postgres: table %q: at most one schema qualifier", idempotency.ErrInvalidConfig, table)
	}
	for i, p := range parts {
		if err := sqlident.Check(p, maxIdentLen); err != nil {
			return "", fmt.Errorf("%w: postgres: table %q: %q %w", idempotency.ErrInvalidConfig, table, p, err)
		}
		parts[i] = `"` + p + `"`
	}
	return strings.Join(parts, "."), nil
}

// indexName names the expires_at index of table (unqualified, in the
// table's schema), within 63 bytes. A long name is cut and made unique by a
// hash, so that two long table names never share an index name.
func indexName(table string) string {
	name := table[strings.LastIndexByte(table, '.')+1:]
	const suffix = "_expires_at_idx"
	if len(name)+len(suffix) <= maxIdentLen {
		return name + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	tail := fmt.Sprintf("_%08x_exp_idx", h.Sum32())
	return name[:maxIdentLen-len(tail)] + tail
}

func schemaSQL(table, quoted string) string {
	return `CREATE TABLE IF NOT EXISTS ` + quoted + ` (
	scope       TEXT COLLATE "C" NOT NULL,
	id          TEXT COLLATE "C" NOT NULL,
	fingerprint TEXT NOT NULL,
	state       TEXT NOT NULL CHECK (state IN ('pending', 'completed')),
	status      INTEGER,
	header      BYTEA,
	body        BYTEA,
	created_at  TIMESTAMPTZ NOT NULL,
	expires_at  TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (scope, id)
);
CREATE INDEX IF NOT EXISTS "` + indexName(table) + `" ON ` + quoted + ` (expires_at);
`
}
