package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// BenchmarkPlainSQL measures the plain SQL algorithm of docs/performance.md
// ("INSERT … ON CONFLICT DO NOTHING" of the key, the
// effect, "UPDATE" of the key with the response, in one transaction; on a
// conflict, ROLLBACK and SELECT the stored response) as a reference
// contender: the same one-row effect as BenchmarkStore, on a pool of the
// same size, in the same run. cmd/idembench prints it next to the library,
// as a ratio to BenchmarkStore/Bare:
//
//	go run ./cmd/idembench -pkgs ./postgres
func BenchmarkPlainSQL(b *testing.B) {
	testkit.BenchmarkContender(b, plainSQLContender(b))
}

// plainSQLContender creates the plain SQL's key table and an effects table of the
// shape BenchmarkStore uses (tag TEXT), dropped when b ends.
func plainSQLContender(b *testing.B) testkit.Contender {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresDSN(b))
	if err != nil {
		b.Fatalf("parse DSN: %v", err)
	}
	cfg.MaxConns = 2 * conformance.Callers // as conformance.Benchmark asks
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatalf("pool: %v", err)
	}
	b.Cleanup(pool.Close)
	keys, effects := testkit.Name("plain_keys_"), testkit.Name("plain_effects_")
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+keys+", "+effects); err != nil {
			b.Errorf("drop plain SQL tables: %v", err)
		}
	})
	// The key table of the plain SQL: key, body hash, status, response.
	if _, err := pool.Exec(ctx, `CREATE TABLE `+keys+` (
		chave TEXT PRIMARY KEY,
		hash_corpo TEXT NOT NULL,
		status_http INT,
		resposta JSONB,
		criada_em TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		b.Fatalf("create plain SQL keys table: %v", err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+effects+" (tag TEXT)"); err != nil {
		b.Fatalf("create plain SQL effects table: %v", err)
	}
	s := &plainSQLPG{
		pool:    pool,
		reserve: "INSERT INTO " + keys + " (chave, hash_corpo) VALUES ($1, $2) ON CONFLICT (chave) DO NOTHING",
		effect:  "INSERT INTO " + effects + " (tag) VALUES ($1)",
		finish:  "UPDATE " + keys + " SET status_http = 201, resposta = $2 WHERE chave = $1",
		lookup:  "SELECT hash_corpo, status_http, resposta FROM " + keys + " WHERE chave = $1",
		count:   "SELECT count(*) FROM " + effects,
	}
	return testkit.Contender{Do: s.do, Effects: s.effects}
}

// plainSQLPG is the plain SQL on pgx, statement for statement.
type plainSQLPG struct {
	pool                                   *pgxpool.Pool
	reserve, effect, finish, lookup, count string
}

func (s *plainSQLPG) do(ctx context.Context, key string) (replayed bool, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, s.reserve, key, testkit.ContenderFingerprint)
	if err != nil {
		return false, err
	}
	if tag.RowsAffected() == 0 {
		if err := tx.Rollback(ctx); err != nil {
			return false, err
		}
		var fp string
		var status *int32
		var body []byte
		if err := s.pool.QueryRow(ctx, s.lookup, key).Scan(&fp, &status, &body); err != nil {
			return false, err
		}
		if fp != testkit.ContenderFingerprint || status == nil || *status != 201 || len(body) == 0 {
			return false, errors.New("plain SQL: stored answer is not the one written")
		}
		return true, nil
	}
	if _, err := tx.Exec(ctx, s.effect, "plain"); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, s.finish, key, testkit.ContenderBody); err != nil {
		return false, err
	}
	return false, tx.Commit(ctx)
}

func (s *plainSQLPG) effects(ctx context.Context) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, s.count).Scan(&n)
	return n, err
}
