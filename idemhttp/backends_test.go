package idemhttp_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
	"github.com/go-idempotency/idempotency/sqlite"
)

func TestMiddlewareSQLite(t *testing.T) {
	t.Parallel()
	runMiddlewareTests(t, sqliteEnv)
}

func TestMiddlewarePostgres(t *testing.T) {
	t.Parallel()
	runMiddlewareTests(t, postgresEnv)
}

func guardOn[Tx any](t *testing.T, s idempotency.KeyStore[Tx]) func(*idempotency.Config) *idempotency.Guard[Tx] {
	return func(cfg *idempotency.Config) *idempotency.Guard[Tx] {
		g, err := idempotency.New(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
}

// sqliteEnv is a fresh SQLite database file with an effects table.
func sqliteEnv(t *testing.T) env[*sql.Tx] {
	ctx := testkit.Context(t, 20*time.Second)
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "idemhttp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := sqlite.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	fx := testkit.Effects{DB: db, Table: "effects"}
	if err := fx.Create(ctx, "TEXT NOT NULL"); err != nil {
		t.Fatal(err)
	}
	return env[*sql.Tx]{
		newGuard: guardOn(t, s),
		effect:   fx.Effect,
		count: func(ctx context.Context, tag string) int {
			n, err := fx.Count(ctx, tag)
			if err != nil {
				t.Fatal(err)
			}
			return n
		},
		breakStore: func() { db.Close() },
	}
}

// postgresEnv is a fresh pair of tables (keys, effects) with random names,
// dropped at cleanup.
func postgresEnv(t *testing.T) env[pgx.Tx] {
	ctx := testkit.Context(t, 20*time.Second)
	rig := pgkit.NewRig(t, ctx, testenv.PostgresDSN(t), "idemhttp_", "effects", "tag TEXT NOT NULL")
	pool, s, effects := rig.Pool, rig.Store, rig.Rows
	return env[pgx.Tx]{
		newGuard: guardOn(t, s),
		effect: func(ctx context.Context, tx pgx.Tx, tag string) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (tag) VALUES ($1)`, tag)
			return err
		},
		count: func(ctx context.Context, tag string) int {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+effects+` WHERE tag = $1`, tag).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
		breakStore: pool.Close,
	}
}
