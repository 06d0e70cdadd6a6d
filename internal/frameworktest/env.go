package frameworktest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/sqlite"
)

// Env is one store with an effects table.
type Env[Tx any] struct {
	Store    idempotency.KeyStore[Tx]
	Handlers Handlers
	// Count counts the committed effects of a key (scope/id).
	Count func(t *testing.T, scope, id string) int
	runs  *atomic.Int64
}

// Guard builds a guard on the env's store.
func (e *Env[Tx]) Guard(t *testing.T, cfg *idempotency.Config) *idempotency.Guard[Tx] {
	t.Helper()
	g, err := idempotency.New(e.Store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Runs returns how many times handlers ran.
func (e *Env[Tx]) Runs() int64 { return e.runs.Load() }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func tag(ctx context.Context) (string, error) {
	k, ok := idempotency.KeyFrom(ctx)
	if !ok {
		return "", fmt.Errorf("frameworktest: no idempotency key in the handler's context")
	}
	return k.Scope + "/" + k.ID, nil
}

// SQLite returns a fresh SQLite database file with an effects table.
func SQLite(t *testing.T) *Env[*sql.Tx] {
	c := ctx(t)
	db, err := sqlite.Open(c, filepath.Join(t.TempDir(), "frameworks.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := sqlite.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(c); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(c, `CREATE TABLE effects (tag TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	runs := new(atomic.Int64)
	return &Env[*sql.Tx]{
		Store: s,
		runs:  runs,
		Handlers: Handlers{
			Run: func() int64 { return runs.Add(1) },
			Effect: func(ctx context.Context) error {
				tx, ok := idempotency.TxFrom[*sql.Tx](ctx)
				if !ok {
					return fmt.Errorf("frameworktest: no transaction in the handler's context")
				}
				tg, err := tag(ctx)
				if err != nil {
					return err
				}
				_, err = tx.ExecContext(ctx, `INSERT INTO effects (tag) VALUES (?)`, tg)
				return err
			},
		},
		Count: func(t *testing.T, scope, id string) int {
			var n int
			if err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM effects WHERE tag = ?`, scope+"/"+id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}

// Postgres returns fresh tables (keys, effects) with random names in the
// database of IDEMPOTENCY_POSTGRES_DSN, dropped at cleanup.
func Postgres(t *testing.T) *Env[pgx.Tx] {
	c := ctx(t)
	dsn := testenv.PostgresDSN(t)
	pool, err := pgxpool.New(c, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var b [6]byte
	_, _ = rand.Read(b[:])
	table := "frameworks_" + hex.EncodeToString(b[:])
	effects := table + "_effects"
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(c, `DROP TABLE IF EXISTS `+table+`, `+table+`_quota, `+effects); err != nil {
			t.Error(err)
		}
	})
	s, err := postgres.New(pool, &postgres.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(c); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(c, `CREATE TABLE `+effects+` (tag TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	runs := new(atomic.Int64)
	return &Env[pgx.Tx]{
		Store: s,
		runs:  runs,
		Handlers: Handlers{
			Run: func() int64 { return runs.Add(1) },
			Effect: func(ctx context.Context) error {
				tx, ok := idempotency.TxFrom[pgx.Tx](ctx)
				if !ok {
					return fmt.Errorf("frameworktest: no transaction in the handler's context")
				}
				tg, err := tag(ctx)
				if err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `INSERT INTO `+effects+` (tag) VALUES ($1)`, tg)
				return err
			},
		},
		Count: func(t *testing.T, scope, id string) int {
			var n int
			if err := pool.QueryRow(ctx(t), `SELECT count(*) FROM `+effects+` WHERE tag = $1`, scope+"/"+id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}
