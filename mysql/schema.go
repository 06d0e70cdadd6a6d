package mysql

import (
	"context"
	"fmt"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/sqlident"
)

// maxTableLen is the longest table name [New] accepts (MySQL allows 64).
const maxTableLen = 63

// Schema returns the DDL of the keys table named table (see [Config.Table]),
// for users' migrations. It is one CREATE TABLE IF NOT EXISTS statement,
// with the index on expires_at that [Store.Purge] uses, safe to run again.
//
// Keys are VARBINARY, so they compare byte for byte ("abc", "ABC" and
// "abc " are three keys). Times are BIGINT Unix nanoseconds, so neither the
// DSN's parseTime and loc nor the server's time zone matter.
func Schema(table string) (string, error) {
	if err := checkTable(table); err != nil {
		return "", err
	}
	return "CREATE TABLE IF NOT EXISTS `" + table + "` (\n" +
		"  scope       VARBINARY(255) NOT NULL,\n" +
		"  id          VARBINARY(255) NOT NULL,\n" +
		"  fingerprint VARBINARY(255) NOT NULL,\n" +
		"  state       VARCHAR(9) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,\n" +
		"  status      INT NOT NULL DEFAULT 0,\n" +
		"  header      LONGBLOB NULL,\n" +
		"  body        LONGBLOB NULL,\n" +
		"  created_at  BIGINT NOT NULL COMMENT 'Unix nanoseconds',\n" +
		"  expires_at  BIGINT NOT NULL COMMENT 'Unix nanoseconds',\n" +
		"  PRIMARY KEY (scope, id),\n" +
		"  KEY expires_at_idx (expires_at)\n" +
		") ENGINE=InnoDB", nil
}

func checkTable(table string) error {
	if err := sqlident.Check(table, maxTableLen); err != nil {
		return fmt.Errorf("%w: mysql: table name %q %w", idempotency.ErrInvalidConfig, table, err)
	}
	return nil
}

// Schema returns the DDL of s's table; see the package-level [Schema].
func (s *Store) Schema() string { return s.schema }

// Migrate creates s's table and its index if they do not exist. It is
// idempotent and safe to run from several processes at once.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.schema); err != nil {
		return fmt.Errorf("mysql: migrate %s: %w", s.table, err)
	}
	return nil
}
