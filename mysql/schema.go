package mysql

import (
	"context"
	"errors"
	"fmt"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/sqlident"
)

// maxTableLen is the longest table name [New] accepts (MySQL allows 64).
const maxTableLen = 63

// stepColumns are the columns of multi-step operations ([Store.Acquire]),
// added in v0.2.0, with their definitions: what [Store.Migrate] adds to a
// table of the v0.1.0 schema, in this order.
var stepColumns = [][2]string{
	{"progress", "MEDIUMBLOB NULL"},
	{"owner", "VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL"},
	{"lease_ends", "BIGINT NULL COMMENT 'Unix nanoseconds'"},
	{"tries", "INT NOT NULL DEFAULT 0"},
}

// leaseIndex is the index on lease_ends that [Store.Abandoned] scans.
const leaseIndex = "lease_ends_idx"

// MySQL and MariaDB error numbers of concurrent migrations.
const (
	erDupFieldName = 1060 // ER_DUP_FIELDNAME: the column exists already
	erDupKeyName   = 1061 // ER_DUP_KEYNAME: the index exists already
	erBadFieldName = 1054 // ER_BAD_FIELD_ERROR: an unknown column
	erParse        = 1064 // ER_PARSE_ERROR: a syntax the server lacks
)

// Schema returns the DDL of the keys table named table (see [Config.Table]),
// for users' migrations. It is one CREATE TABLE IF NOT EXISTS statement,
// with the index on expires_at that [Store.Purge] uses and the one on
// lease_ends that [Store.Abandoned] uses, safe to run again.
//
// Keys are VARBINARY, so they compare byte for byte ("abc", "ABC" and
// "abc " are three keys). Times are BIGINT Unix nanoseconds, so neither the
// DSN's parseTime and loc nor the server's time zone matter.
//
// The columns progress, owner, lease_ends and tries hold multi-step
// operations ([Store.Acquire]); they are new in v0.2.0. CREATE TABLE IF NOT
// EXISTS leaves a table of v0.1.0 as it is: [Store.Migrate] adds them, or
// by hand (one statement, instant on MariaDB 10.3+ and MySQL 8.0.29+ but
// for the index):
//
//	ALTER TABLE `idempotency_keys`
//	  ADD COLUMN progress MEDIUMBLOB NULL,
//	  ADD COLUMN owner VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL,
//	  ADD COLUMN lease_ends BIGINT NULL COMMENT 'Unix nanoseconds',
//	  ADD COLUMN tries INT NOT NULL DEFAULT 0,
//	  ADD KEY lease_ends_idx (lease_ends);
//
// Until then [idempotency.Guard.Do] keeps working on the old table (its
// statements do not need the new columns); multi-step operations and the
// key administration need them.
func Schema(table string) (string, error) {
	if err := checkTable(table); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("CREATE TABLE IF NOT EXISTS `" + table + "` (\n" +
		"  scope       VARBINARY(255) NOT NULL,\n" +
		"  id          VARBINARY(255) NOT NULL,\n" +
		"  fingerprint VARBINARY(255) NOT NULL,\n" +
		"  state       VARCHAR(9) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,\n" +
		"  status      INT NOT NULL DEFAULT 0,\n" +
		"  header      LONGBLOB NULL,\n" +
		"  body        LONGBLOB NULL,\n" +
		"  created_at  BIGINT NOT NULL COMMENT 'Unix nanoseconds',\n" +
		"  expires_at  BIGINT NOT NULL COMMENT 'Unix nanoseconds',\n")
	for _, c := range stepColumns {
		fmt.Fprintf(&b, "  %-11s %s,\n", c[0], c[1])
	}
	b.WriteString("  PRIMARY KEY (scope, id),\n" +
		"  KEY expires_at_idx (expires_at),\n" +
		"  KEY " + leaseIndex + " (lease_ends)\n" +
		") ENGINE=InnoDB")
	return b.String(), nil
}

func checkTable(table string) error {
	if err := sqlident.Check(table, maxTableLen); err != nil {
		return fmt.Errorf("%w: mysql: table name %q %w", idempotency.ErrInvalidConfig, table, err)
	}
	return nil
}

// Schema returns the DDL of s's table; see the package-level [Schema].
func (s *Store) Schema() string { return s.schema }

// Migrate creates s's table and its indexes if they do not exist, and
// upgrades a table of the v0.1.0 schema: it adds the columns of multi-step
// operations and the index on lease_ends that information_schema says are
// missing, in one ALTER TABLE (MySQL 8 has no ADD COLUMN IF NOT EXISTS). It
// is idempotent and safe to run from several processes at once: an ALTER
// that another process's ALTER beat (a duplicate column or index, errors
// 1060 and 1061) is followed by a fresh look at what is still missing.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.schema); err != nil {
		return fmt.Errorf("mysql: migrate %s: %w", s.table, err)
	}
	if err := s.migrateQuota(ctx); err != nil {
		return err
	}
	for range 4 {
		alter, err := s.missingDDL(ctx)
		if err != nil || alter == "" {
			return err
		}
		_, err = s.db.ExecContext(ctx, alter)
		var me *gomysql.MySQLError
		if err == nil || !errors.As(err, &me) || (me.Number != erDupFieldName && me.Number != erDupKeyName) {
			if err != nil {
				return fmt.Errorf("mysql: migrate %s: upgrade: %w", s.table, err)
			}
			return nil
		}
		// Another process added some of it meanwhile: look again.
	}
	return fmt.Errorf("mysql: migrate %s: upgrade: %w: other migrations kept changing the table", s.table, backend.ErrConflict)
}

// missingDDL returns the ALTER TABLE that adds to s's table the columns of
// stepColumns and the index leaseIndex that it lacks, or "" when it has
// them all.
func (s *Store) missingDDL(ctx context.Context) (string, error) {
	have := map[string]bool{}
	rows, err := s.db.QueryContext(ctx, `SELECT LOWER(COLUMN_NAME) FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?
UNION ALL SELECT CONCAT('index:', LOWER(INDEX_NAME)) FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`, s.table, s.table)
	if err != nil {
		return "", fmt.Errorf("mysql: migrate %s: read columns: %w", s.table, err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return "", fmt.Errorf("mysql: migrate %s: read columns: %w", s.table, err)
		}
		have[name] = true
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("mysql: migrate %s: read columns: %w", s.table, err)
	}
	var adds []string
	for _, c := range stepColumns {
		if !have[c[0]] {
			adds = append(adds, "ADD COLUMN "+c[0]+" "+c[1])
		}
	}
	if !have["index:"+leaseIndex] {
		adds = append(adds, "ADD KEY "+leaseIndex+" (lease_ends)")
	}
	if len(adds) == 0 {
		return "", nil
	}
	return "ALTER TABLE `" + s.table + "` " + strings.Join(adds, ", "), nil
}
