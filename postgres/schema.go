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
// for users' migrations: CREATE TABLE IF NOT EXISTS, a DO block that adds the
// columns of multi-step operations to a table of v0.1.0 that lacks them, and
// CREATE INDEX IF NOT EXISTS; safe to run again.
//
// A table created by v0.1.0 keeps working for [idempotency.Guard.Do] until
// it is upgraded; multi-step operations and key administration need the
// columns progress, owner, lease_ends and tries. [Store.Migrate] (or this
// DDL) adds them. To upgrade the table by hand instead, run (with the
// table's name):
//
//	ALTER TABLE idempotency_keys
//		ADD COLUMN IF NOT EXISTS progress   BYTEA,
//		ADD COLUMN IF NOT EXISTS owner      TEXT,
//		ADD COLUMN IF NOT EXISTS lease_ends TIMESTAMPTZ,
//		ADD COLUMN IF NOT EXISTS tries      INTEGER NOT NULL DEFAULT 0;
//	CREATE INDEX IF NOT EXISTS idempotency_keys_lease_ends_idx
//		ON idempotency_keys (lease_ends) WHERE progress IS NOT NULL;
//
// On PostgreSQL 11 and later adding these columns rewrites no row; the ALTER
// takes the table's ACCESS EXCLUSIVE lock for a moment, so it waits for the
// transactions open on the table and makes new ones wait behind it. The DO
// block of Schema takes that lock only when a column is missing.
func Schema(table string) (string, error) {
	q, err := quoteTable(table)
	if err != nil {
		return "", err
	}
	return schemaSQL(table, q), nil
}

// Schema returns the DDL of s's table; see the package-level [Schema].
func (s *Store) Schema() string { return s.schema }

// Migrate creates s's table and its indexes if they do not exist, and adds
// the columns of multi-step operations to a table of v0.1.0 (see [Schema]).
// It is idempotent and safe to run from several processes at once: they take
// turns on an advisory lock.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.q.exec(ctx, s.sql.migrate); err != nil {
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
func indexName(table string) string { return indexNamed(table, "_expires_at_idx", "_exp_idx") }

// leaseIndexName names the lease_ends index of table, as indexName does.
func leaseIndexName(table string) string { return indexNamed(table, "_lease_ends_idx", "_lease_idx") }

// indexNamed is table's name plus suffix, or, when that is longer than 63
// bytes, its head plus a hash of it and short.
func indexNamed(table, suffix, short string) string {
	name := table[strings.LastIndexByte(table, '.')+1:]
	if len(name)+len(suffix) <= maxIdentLen {
		return name + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	tail := fmt.Sprintf("_%08x%s", h.Sum32(), short)
	return name[:maxIdentLen-len(tail)] + tail
}

// schemaSQL is the DDL of the table: the columns after expires_at are those
// of multi-step operations (see [backend.Stepper]), which the DO block
// adds to a table of v0.1.0. It checks pg_attribute first, so that a table
// already upgraded is not locked at all.
func schemaSQL(table, quoted string) string {
	// quoted holds letters, digits, underscores, dots and double quotes
	// only: safe inside a string literal and a dollar-quoted body.
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
	progress    BYTEA,
	owner       TEXT,
	lease_ends  TIMESTAMPTZ,
	tries       INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (scope, id)
);
DO $idempotency$ BEGIN
	IF (SELECT count(*) FROM pg_attribute WHERE attrelid = '` + quoted + `'::regclass
		AND attname IN ('progress', 'owner', 'lease_ends', 'tries') AND NOT attisdropped) < 4 THEN
		ALTER TABLE ` + quoted + `
			ADD COLUMN IF NOT EXISTS progress   BYTEA,
			ADD COLUMN IF NOT EXISTS owner      TEXT,
			ADD COLUMN IF NOT EXISTS lease_ends TIMESTAMPTZ,
			ADD COLUMN IF NOT EXISTS tries      INTEGER NOT NULL DEFAULT 0;
	END IF;
END $idempotency$;
CREATE INDEX IF NOT EXISTS "` + indexName(table) + `" ON ` + quoted + ` (expires_at);
CREATE INDEX IF NOT EXISTS "` + leaseIndexName(table) + `" ON ` + quoted + ` (lease_ends) WHERE progress IS NOT NULL;
`
}
