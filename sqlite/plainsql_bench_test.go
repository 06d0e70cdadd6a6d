package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/sqlite"
)

// BenchmarkPlainSQL measures the SQLite form of the plain SQL algorithm of
// docs/performance.md: in one transaction that takes the write lock at
// BEGIN (BEGIN IMMEDIATE, as sqlite.Open's DSN asks), "INSERT … ON
// CONFLICT DO NOTHING" of the key, the effect, and "UPDATE" of the key with
// the response; on a conflict, ROLLBACK and SELECT the stored response. Its
// own statements are prepared once, as the library's are; the effect is
// run as BenchmarkStore's is (unprepared). It is a reference
// contender: the same one-row effect as BenchmarkStore, on a database
// opened with sqlite.Open (its own file in the same directory as the
// library's) and a pool of the same size, in the same run. cmd/idembench
// prints it next to the library, as a ratio to BenchmarkStore/Bare:
//
//	go run ./cmd/idembench -pkgs ./sqlite
func BenchmarkPlainSQL(b *testing.B) {
	testkit.BenchmarkContender(b, plainSQLContender(b))
}

// plainSQLContender creates the plain SQL's key table and an effects table
// of the shape BenchmarkStore uses (tag TEXT) in a database file of b's
// temporary directory.
func plainSQLContender(b *testing.B) testkit.Contender {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "plain.db"))
	if err != nil {
		b.Fatalf("open: %v", err)
	}
	b.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(2 * conformance.Callers) // as conformance.Benchmark asks
	// The key table of the plain SQL: key, body hash, status, response.
	if _, err := db.ExecContext(ctx, `CREATE TABLE plain_keys (
		chave TEXT PRIMARY KEY,
		hash_corpo TEXT NOT NULL,
		status_http INTEGER,
		resposta BLOB,
		criada_em INTEGER NOT NULL DEFAULT (unixepoch()))`); err != nil {
		b.Fatalf("create plain SQL keys table: %v", err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE plain_effects (tag TEXT)"); err != nil {
		b.Fatalf("create plain SQL effects table: %v", err)
	}
	s := &plainSQLite{db: db}
	for _, p := range []struct {
		dst   **sql.Stmt
		query string
	}{
		{&s.reserve, "INSERT INTO plain_keys (chave, hash_corpo) VALUES (?1, ?2) ON CONFLICT (chave) DO NOTHING"},
		{&s.finish, "UPDATE plain_keys SET status_http = 201, resposta = ?2 WHERE chave = ?1"},
		{&s.lookup, "SELECT hash_corpo, status_http, resposta FROM plain_keys WHERE chave = ?1"},
		{&s.count, "SELECT count(*) FROM plain_effects"},
	} {
		stmt, err := db.PrepareContext(ctx, p.query)
		if err != nil {
			b.Fatalf("prepare %q: %v", p.query, err)
		}
		b.Cleanup(func() { _ = stmt.Close() })
		*p.dst = stmt
	}
	return testkit.Contender{Do: s.do, Effects: s.effects}
}

// plainSQLite is the plain SQL on database/sql, statement for statement.
type plainSQLite struct {
	db                             *sql.DB
	reserve, finish, lookup, count *sql.Stmt
}

func (s *plainSQLite) do(ctx context.Context, key string) (replayed bool, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.StmtContext(ctx, s.reserve).ExecContext(ctx, key, testkit.ContenderFingerprint)
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return false, err
	} else if n == 0 {
		if err := tx.Rollback(); err != nil {
			return false, err
		}
		var (
			fp     string
			status sql.NullInt64
			body   []byte
		)
		if err := s.lookup.QueryRowContext(ctx, key).Scan(&fp, &status, &body); err != nil {
			return false, err
		}
		if fp != testkit.ContenderFingerprint || status.Int64 != 201 || string(body) != testkit.ContenderBody {
			return false, errors.New("plain SQL: stored answer is not the one written")
		}
		return true, nil
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO plain_effects (tag) VALUES (?)", "plain"); err != nil {
		return false, err
	}
	if _, err := tx.StmtContext(ctx, s.finish).ExecContext(ctx, key, []byte(testkit.ContenderBody)); err != nil {
		return false, err
	}
	return false, tx.Commit()
}

func (s *plainSQLite) effects(ctx context.Context) (int, error) {
	var n int
	err := s.count.QueryRowContext(ctx).Scan(&n)
	return n, err
}
