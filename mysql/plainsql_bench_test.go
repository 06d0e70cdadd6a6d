package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// BenchmarkPlainSQL measures the MySQL form of the plain SQL algorithm of
// docs/performance.md: in one transaction, "INSERT IGNORE" of the
// key (MySQL's "ON CONFLICT DO NOTHING": it waits for a transaction that
// holds the key, then ignores the duplicate), the effect, and "UPDATE" of
// the key with the response; on a duplicate, ROLLBACK and SELECT the stored
// response. It is a reference contender: the same one-row effect as
// BenchmarkStore, on the same DSN settings (interpolateParams,
// innodb_lock_wait_timeout=30) and a pool of the same size, in the same run.
// cmd/idembench prints it next to the library, as a ratio to
// BenchmarkStore/Bare:
//
//	go run ./cmd/idembench -pkgs ./mysql
func BenchmarkPlainSQL(b *testing.B) {
	testkit.BenchmarkContender(b, plainSQLContender(b))
}

// plainSQLContender creates the plain SQL's key table and an effects table of the
// shape BenchmarkStore uses (tag VARBINARY), dropped when b ends.
func plainSQLContender(b *testing.B) testkit.Contender {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := gomysql.ParseDSN(testenv.MySQLDSN(b))
	if err != nil {
		b.Fatalf("parse %s: %v", testenv.MySQLEnv, err)
	}
	// The DSN of BenchmarkStore (the package's recommended one).
	cfg.InterpolateParams = true
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["innodb_lock_wait_timeout"] = "30"
	connector, err := gomysql.NewConnector(cfg)
	if err != nil {
		b.Fatalf("connector: %v", err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(2 * conformance.Callers) // as conformance.Benchmark asks
	db.SetMaxIdleConns(2 * conformance.Callers)
	b.Cleanup(func() { _ = db.Close() })
	keys, effects := testkit.Name("plain_keys_"), testkit.Name("plain_effects_")
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+keys+"`, `"+effects+"`"); err != nil {
			b.Errorf("drop plain SQL tables: %v", err)
		}
	})
	// The key table of the plain SQL in MySQL types (keys compared byte for
	// byte, as the store's are).
	if _, err := db.ExecContext(ctx, "CREATE TABLE `"+keys+"` ("+
		"chave VARBINARY(255) NOT NULL PRIMARY KEY, "+
		"hash_corpo VARCHAR(64) NOT NULL, "+
		"status_http INT NULL, "+
		"resposta JSON NULL, "+
		"criada_em TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB"); err != nil {
		b.Fatalf("create plain SQL keys table: %v", err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE `"+effects+"` (tag VARBINARY(1024) NOT NULL) ENGINE=InnoDB"); err != nil {
		b.Fatalf("create plain SQL effects table: %v", err)
	}
	s := &plainSQLMySQL{
		db:      db,
		reserve: "INSERT IGNORE INTO `" + keys + "` (chave, hash_corpo) VALUES (?, ?)",
		effect:  "INSERT INTO `" + effects + "` (tag) VALUES (?)",
		finish:  "UPDATE `" + keys + "` SET status_http = 201, resposta = ? WHERE chave = ?",
		lookup:  "SELECT hash_corpo, status_http, resposta FROM `" + keys + "` WHERE chave = ?",
		count:   "SELECT count(*) FROM `" + effects + "`",
	}
	return testkit.Contender{Do: s.do, Effects: s.effects}
}

// plainSQLMySQL is the plain SQL on database/sql, statement for
// statement.
type plainSQLMySQL struct {
	db                                     *sql.DB
	reserve, effect, finish, lookup, count string
}

func (s *plainSQLMySQL) do(ctx context.Context, key string) (replayed bool, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, s.reserve, []byte(key), testkit.ContenderFingerprint)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	if n == 0 {
		if err := tx.Rollback(); err != nil {
			return false, err
		}
		var fp string
		var status sql.NullInt32
		var body []byte
		if err := s.db.QueryRowContext(ctx, s.lookup, []byte(key)).Scan(&fp, &status, &body); err != nil {
			return false, err
		}
		if fp != testkit.ContenderFingerprint || status.Int32 != 201 || len(body) == 0 {
			return false, errors.New("plain SQL: stored answer is not the one written")
		}
		return true, nil
	}
	if _, err := tx.ExecContext(ctx, s.effect, []byte("plain")); err != nil {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, s.finish, testkit.ContenderBody, []byte(key)); err != nil {
		return false, err
	}
	return false, tx.Commit()
}

func (s *plainSQLMySQL) effects(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, s.count).Scan(&n)
	return n, err
}
